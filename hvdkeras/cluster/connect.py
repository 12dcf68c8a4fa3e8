"""Joining N separately started MPI processes into one intracommunicator.

Each task's rank (a Spark task's, a Ray actor's) is its own one-process MPI
job; the ranks join with MPI_Open_port / MPI_Comm_accept / MPI_Comm_connect,
one step at a time so that every port only ever sees one connecting group
(concurrent connects to one port crashed MPICH 5.0.2 now and then in our
trials):

    group {n-1}            connects to rank n-2's port  -> group {n-2, n-1}
    group {n-2, n-1}       connects to rank n-3's port  -> group {n-3, n-2, n-1}
    ...                                                   -> group {0, ..., n-1}

The process that accepts takes the low ranks of the merged group, so the
final ranks equal the task indices. `chain_steps` is the pure plan.
"""

from __future__ import annotations

from typing import Any, Sequence


def chain_steps(index: int, size: int) -> list[tuple[str, int]]:
    """What task `index` of `size` does, in order: ("accept", k) or ("connect", k).

    ("accept", index) waits on this task's own port for the group of the
    tasks after it; ("connect", k) joins the group it belongs to to task k.

    >>> chain_steps(0, 3), chain_steps(1, 3), chain_steps(2, 3)
    ([('accept', 0)], [('accept', 1), ('connect', 0)], [('connect', 1), ('connect', 0)])
    """
    if not 0 <= index < size:
        raise ValueError(f"index {index} is not in [0, {size}).")
    steps: list[tuple[str, int]] = []
    if index < size - 1:
        steps.append(("accept", index))
    for k in range(index - 1, -1, -1):
        steps.append(("connect", k))
    return steps


def chain_connect(MPI: Any, index: int, size: int, ports: Sequence[str]) -> Any:
    """Runs `chain_steps` with mpi4py; returns an Intracomm whose ranks are the task indices."""
    comm = MPI.COMM_SELF
    for action, k in chain_steps(index, size):
        if action == "accept":
            inter = comm.Accept(ports[k], root=0)
            merged = inter.Merge(high=False)
        else:
            inter = comm.Connect(ports[k], root=0)
            merged = inter.Merge(high=True)
        inter.Disconnect()
        if comm != MPI.COMM_SELF:
            comm.Free()
        comm = merged
    # Ranks already follow the indices; the split makes that a guarantee.
    ordered = comm.Split(0, index)
    if comm != MPI.COMM_SELF:
        comm.Free()
    if ordered.Get_size() != size or ordered.Get_rank() != index:
        raise RuntimeError(f"joined a world of {ordered.Get_size()} as rank {ordered.Get_rank()}, "
                           f"expected {size} and {index}")
    return ordered

"""Process sets: collectives over a subset of the ranks, under Horovod's names.

A `ProcessSet` lists global ranks. Once registered (statically through
`hvdkeras.init(process_sets=[...])` or dynamically through
`add_process_set`), it has an id that every rank agrees on, and a
collective given `process_set=` runs among its ranks only, negotiated
independently of the global set and of other sets, so sets can work at the
same time (see Note [process set engines] in ops/core/engine.h).

As in Horovod, a rank argument of a collective (`root_rank`) is a global
rank, while `ProcessSet.rank()` is this process's position in the set (the
order of an allgather's blocks).

What may import this module: `hvdkeras.engine.world` (which opens and closes
the registry), and anything above the engine. It imports mpi4py only through
the communicator `world` hands it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from hvdkeras.engine import agreement, c_api


class ProcessSet:
    """A set of ranks that run collectives together.

    Args:
        ranks_or_comm: The global ranks of the set (any order; kept sorted),
            or an `mpi4py.MPI.Comm` whose processes form the set (only in
            `hvdkeras.init(process_sets=[...])`).

    Example:

    ```python
    evens = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[evens])
    if evens.included():
        total = hvd.allreduce(x, op=hvd.Sum, process_set=evens)
    ```
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]):
        self.process_set_id: Optional[int] = None
        self.ranks: Optional[List[int]] = None
        self.mpi_comm: Any = None
        if isinstance(ranks_or_comm, (list, tuple, range, set, frozenset)):
            ranks = list(ranks_or_comm)
            bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int)]
            if bad:
                raise ValueError(f"ProcessSet takes a list of integer ranks or an mpi4py "
                                 f"communicator; {bad[0]!r} is not a rank.")
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"ProcessSet ranks {sorted(ranks)} list a rank twice.")
            self.ranks = sorted(ranks)
        elif hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
        else:
            raise ValueError("ProcessSet takes a list of integer ranks or an mpi4py "
                             f"communicator, not {type(ranks_or_comm).__name__}.")

    def size(self) -> Optional[int]:
        """The number of ranks in the set (None until registered)."""
        if self.process_set_id is None:
            return None
        return set_size(self.process_set_id)

    def rank(self) -> Optional[int]:
        """This process's position in the set (None until registered, or if not a member)."""
        if self.process_set_id is None:
            return None
        return _registered(self.process_set_id).set_rank

    def included(self) -> Optional[bool]:
        """Whether this process is in the set (None while its ranks are unknown)."""
        if self.ranks is None or _state is None:
            return None
        return _state.rank in self.ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


@dataclasses.dataclass
class _Registered:
    ranks: Tuple[int, ...]
    comm: Any  # the set's communicator on members; None elsewhere
    set_rank: Optional[int]  # this process's position; None if not a member


@dataclasses.dataclass
class _State:
    control: Any  # a private duplicate of the world communicator, for set bookkeeping
    rank: int
    size: int
    threads_multiple: bool  # MPI_THREAD_MULTIPLE: engine threads of their own may run MPI
    config: Any
    lib: Any
    sets: Dict[int, _Registered]
    next_id: int = 1


_state: Optional[_State] = None


def _require() -> _State:
    if _state is None:
        raise ValueError("hvdkeras has not been initialized (or has been shut down): "
                         "call hvdkeras.init() first.")
    return _state


def _registered(set_id: int) -> _Registered:
    state = _require()
    if set_id not in state.sets:
        raise ValueError(f"Process set {set_id} is not registered (it was removed, or "
                         "hvdkeras was shut down and started again).")
    return state.sets[set_id]


def open_registry(control: Any, rank: int, size: int, threads_multiple: bool, config: Any,
                  lib: Any) -> None:
    """Called by `init()` once the global engine runs; `control` becomes ours."""
    global _state
    _state = _State(control=control, rank=rank, size=size, threads_multiple=threads_multiple,
                    config=config, lib=lib,
                    sets={0: _Registered(tuple(range(size)), None, rank)})
    global_process_set.ranks = list(range(size))


def close_registry() -> None:
    """Called by `shutdown()` before the global engine stops: stops every added set."""
    global _state
    if _state is None:
        return
    state, _state = _state, None
    for set_id in sorted(state.sets, reverse=True):
        if set_id != 0:
            _stop(state, set_id)
    state.control.Free()


def _stop(state: _State, set_id: int) -> None:
    entry = state.sets.pop(set_id)
    if entry.comm is not None:
        state.lib.hvdkeras_process_set_stop(set_id)
        entry.comm.Free()


@dataclasses.dataclass(frozen=True)
class SetView:
    """What a collective needs to know about its process set."""

    set_id: int
    ranks: Tuple[int, ...]
    set_rank: int

    @property
    def size(self) -> int:
        return len(self.ranks)

    def set_rank_of(self, global_rank: int, what: str) -> int:
        """The position in this set of `global_rank`, or a ValueError naming `what`."""
        if global_rank not in self.ranks and self.set_id == 0:
            raise ValueError(f"Invalid {what} {global_rank}: the job has {self.size} rank(s), "
                             f"so it must be in 0..{self.size - 1}.")
        if global_rank not in self.ranks:
            raise ValueError(f"{what} {global_rank} is not in process set {self.set_id} "
                             f"(ranks {list(self.ranks)}); give a global rank that is.")
        return self.ranks.index(global_rank)


def view(process_set: Optional[ProcessSet]) -> SetView:
    """The registered set a collective runs on (the global set for None).

    Raises:
        ValueError: if the set is not registered or this rank is not in it.
    """
    state = _require()
    ps = global_process_set if process_set is None else process_set
    if not isinstance(ps, ProcessSet):
        raise ValueError(f"process_set must be an hvdkeras.ProcessSet, got "
                         f"{type(ps).__name__}.")
    if ps.process_set_id is None:
        raise ValueError(f"{ps} has not been registered: pass it to "
                         "hvdkeras.init(process_sets=[...]) or hvdkeras.add_process_set().")
    entry = _registered(ps.process_set_id)
    if entry.set_rank is None:
        raise ValueError(f"Rank {state.rank} is not in process set {ps.process_set_id} "
                         f"(ranks {list(entry.ranks)}): only its members may call its "
                         "collectives (check ProcessSet.included() first).")
    return SetView(ps.process_set_id, entry.ranks, entry.set_rank)


def set_size(set_id: int) -> int:
    """The number of ranks in registered set `set_id` (members or not may ask)."""
    return len(_registered(set_id).ranks)


def view_by_id(set_id: int) -> SetView:
    """`view` for a set known by id (a collective op's `process_set_id`)."""
    ps = ProcessSet.__new__(ProcessSet)
    ps.process_set_id, ps.ranks, ps.mpi_comm = set_id, None, None
    return view(ps)


def _check_ranks(state: _State, ranks: Sequence[int]) -> None:
    if not ranks:
        raise ValueError("A process set needs at least one rank.")
    outside = [r for r in ranks if not 0 <= r < state.size]
    if outside:
        raise ValueError(f"Process set ranks {outside} are outside this job's ranks "
                         f"0..{state.size - 1}.")


def _meet(state: _State, what: str, value: Any) -> List[Any]:
    """Every rank's `value` (bounded; see `hvdkeras.engine.agreement`)."""
    return agreement.meet_with_engine(state.control, state.lib,
                                      state.config.stall_shutdown_seconds, what, value)


def _agree(state: _State, ranks: Tuple[int, ...]) -> None:
    """Checks that every rank asked for the same set (collective over all ranks)."""
    asked = _meet(state, "hvdkeras.add_process_set()", ranks)
    if any(a != asked[0] for a in asked):
        listing = "; ".join(f"rank {r}: {list(a)}" for r, a in enumerate(asked))
        raise ValueError("add_process_set must be called by every rank with the same ranks, "
                         f"in the same order; this call got {listing}.")


def _start(state: _State, ranks: Tuple[int, ...]) -> int:
    """Makes the set's communicator and engine on its members; returns the new id.

    Collective over all ranks; every rank raises if any member failed.
    """
    from mpi4py import MPI  # lazy: MPI is initialized by init() before any set exists

    set_id = state.next_id
    state.next_id += 1
    member = state.rank in ranks
    comm = state.control.Split(color=0 if member else MPI.UNDEFINED, key=state.rank)
    error = ""
    if member:
        try:
            c_api.start_process_set(state.lib, set_id, comm.py2f(), state.config)
        except RuntimeError as e:
            error = str(e)
    errors = [e for e in state.control.allgather(error) if e]
    if errors:
        if member and not error:
            state.lib.hvdkeras_process_set_stop(set_id)
        if member:
            comm.Free()
        raise RuntimeError(errors[0])
    state.sets[set_id] = _Registered(ranks, comm if member else None,
                                     ranks.index(state.rank) if member else None)
    return set_id


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a process set while hvdkeras runs. Every rank must call it, alike.

    Args:
        process_set: A `ProcessSet` of ranks, or the list of global ranks.

    Returns:
        The registered `ProcessSet` (the one given, now with its id).

    Raises:
        ValueError: if the ranks are bad, differ between ranks, or such a set
            is already registered.

    Example:

    ```python
    evens = hvd.add_process_set(range(0, hvd.size(), 2))
    ```
    """
    state = _require()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise ValueError("add_process_set takes ranks; a set defined by an MPI communicator "
                         "can only be given to hvdkeras.init(process_sets=[...]).")
    ranks = tuple(process_set.ranks)
    _agree(state, ranks)  # first: every later check then fails on every rank alike
    _check_ranks(state, ranks)
    for set_id, entry in state.sets.items():
        if entry.ranks == ranks:
            raise ValueError(f"A process set with ranks {list(ranks)} is already registered "
                             f"(id {set_id}); use that one.")
    if not state.threads_multiple:
        raise RuntimeError("Process sets run on engine threads of their own, which needs "
                           "MPI_THREAD_MULTIPLE; MPI was initialized with a lower level.")
    process_set.process_set_id = _start(state, ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Stops and forgets a process set. Every rank must call it, alike.

    Args:
        process_set: A registered `ProcessSet` other than the global one.

    Returns:
        True if it was removed; False for the global set or an unregistered one.

    Example:

    ```python
    hvd.remove_process_set(evens)
    ```
    """
    state = _require()
    set_id = process_set.process_set_id
    asked = _meet(state, "hvdkeras.remove_process_set()", set_id)
    if any(a != asked[0] for a in asked):
        raise ValueError("remove_process_set must be called by every rank with the same "
                         f"set; the ranks gave ids {asked}.")
    if set_id is None or set_id == 0 or set_id not in state.sets:
        return False
    _stop(state, set_id)
    process_set._invalidate()
    return True


def check_init_argument(process_sets: Any) -> None:
    """Checks `init(process_sets=...)` before anything starts."""
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, str) or not isinstance(process_sets, (list, tuple)):
        raise ValueError("init(process_sets=...) takes a list of hvdkeras.ProcessSet or "
                         f"'dynamic', not {process_sets!r}.")
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError("init(process_sets=...) must list hvdkeras.ProcessSet objects, "
                             f"got {type(ps).__name__}.")


def register_at_init(process_sets: Union[str, Sequence[ProcessSet], None]) -> None:
    """Registers `init(process_sets=...)` (checked by `check_init_argument`)."""
    if process_sets is None or process_sets == "dynamic":
        return
    state = _require()
    for ps in process_sets:
        if ps.ranks is not None:
            if tuple(ps.ranks) in [e.ranks for e in state.sets.values()]:
                continue  # listed twice: one set
            add_process_set(ps)
            continue
        # A communicator-defined set: each rank knows only its own
        # communicator's ranks, so gather them all and register each
        # distinct set once, in a fixed order.
        mine = _comm_ranks(ps.mpi_comm, state.control)
        distinct = sorted({r for r in _meet(state, "hvdkeras.init(process_sets=...)", mine)
                           if r is not None})
        for ranks in distinct:
            if ranks not in [e.ranks for e in state.sets.values()]:
                add_process_set(ProcessSet(list(ranks)))
        if mine is not None:
            ps.ranks = list(mine)
            ps.process_set_id = next(i for i, e in state.sets.items() if e.ranks == mine)


def _comm_ranks(comm: Any, control: Any) -> Optional[Tuple[int, ...]]:
    """The hvdkeras ranks of `comm`'s processes (None for MPI.COMM_NULL)."""
    from mpi4py import MPI  # lazy: MPI is initialized by init() before this runs

    if comm == MPI.COMM_NULL:
        return None
    group = comm.Get_group()
    world = control.Get_group()
    translated = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    group.Free()
    world.Free()
    return tuple(sorted(translated))

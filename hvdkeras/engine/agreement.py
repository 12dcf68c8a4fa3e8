"""Bounded meetings of all ranks for hvdkeras's own Python-side MPI calls.

`init()`, the process-set calls and `pin_gpu()` need every rank at the same
point (to make communicators, to compare what each rank asked for). A plain
blocking MPI call there would wait forever for a rank that never comes, so
the ranks first `meet`: each rank sends every other rank what it is doing
and its value, point to point and without blocking, and waits for theirs,
at most the stall bound. Then:

* everyone arrived, all doing the same thing: every rank gets every rank's
  value (an allgather) and the blocking MPI calls that follow cannot hang;
* someone is doing something else (another hvdkeras call): the ranks that
  see it raise at once, naming what each rank is in;
* the bound passes: the ranks that waited raise, naming the ranks that did
  and did not arrive and, where the engine runs, what the missing ranks say
  they are doing (Note [bounded waits] in ops/core/watchdog.h).

The messages use a tag of their own on the communicator they meet on, and
are taken only from the rank expected, so they never match another receive
of hvdkeras's; a program that receives with MPI_ANY_TAG from any source on
the same communicator while hvdkeras starts could take one.

What may import this module: the rest of `hvdkeras.engine` and the layers
above it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from hvdkeras.engine import c_api

# Below 32767, the largest tag every MPI must accept (MPI_TAG_UB).
MEETING_TAG = 29473
# Between checks for the others' messages: short at first, then longer.
_FIRST_POLL_S = 0.0005
_LONGEST_POLL_S = 0.02
# How long the ranks that did not arrive are given to say what they do.
ASK_WAIT_S = 2.0

# Sends still in flight: a request object must outlive its message.
_sends: List[Any] = []


class MeetingError(RuntimeError):
    """Raised when the ranks could not all meet (different calls, or a timeout)."""


def describe_ranks(ranks: List[int], most_runs: int = 32) -> str:
    """Ranks in words, as the C++ core's RankListText writes them. Pure.

    Runs of three or more become a range, so a message about thousands of
    ranks stays a line; after `most_runs` items the rest is counted.

    Args:
        ranks: ascending ranks.
        most_runs: how many items to write before "and N more"; 0 for all.

    Returns:
        "0, 2, 5-9" for [0, 2, 5, 6, 7, 8, 9].

    Example:
        >>> describe_ranks([0, 1, 2, 3, 7])
        '0-3, 7'
    """
    items: List[str] = []
    i = 0
    while i < len(ranks):
        if most_runs and len(items) == most_runs:
            items[-1] += f" and {len(ranks) - i} more"
            break
        end = i + 1
        while end < len(ranks) and ranks[end] == ranks[end - 1] + 1:
            end += 1
        if end - i >= 3:
            items.append(f"{ranks[i]}-{ranks[end - 1]}")
        else:
            end = i + 1
            items.append(str(ranks[i]))
        i = end
    return ", ".join(items)


def diverged_message(what: str, rank: int, theirs: Dict[int, str]) -> str:
    """The error when ranks are in different hvdkeras calls. Pure."""
    others = "; ".join(f"rank {r} is in {w}" for r, w in sorted(theirs.items()))
    return (f"hvdkeras: rank {rank} is in {what}, but {others}. Every rank must make "
            "hvdkeras's set-up calls (init, add_process_set, remove_process_set, pin_gpu) in "
            "the same order: the program diverged between the ranks.")


def timeout_message(what: str, rank: int, seconds: float, arrived: List[int],
                    missing: List[int], answers: Dict[int, str]) -> str:
    """The error when the bound passed before every rank arrived. Pure."""
    lines = [f"hvdkeras: rank {rank} waited {seconds:.1f} s in {what} for rank(s) "
             f"{describe_ranks(missing)}, which never arrived (rank(s) {describe_ranks(arrived)} "
             "did). Every rank must make this call; the wait is bounded by "
             "HVDKERAS_STALL_SHUTDOWN_SECONDS."]
    for r in missing:
        if r in answers:
            lines.append(f"  rank {r} says: {answers[r]}")
    return "\n".join(lines)


def meet(comm: Any, what: str, value: Any = None, timeout_s: float = 0.0,
         ask: Optional[Callable[[List[int], float], Dict[int, str]]] = None,
         say: Optional[Callable[[str], None]] = None) -> List[Any]:
    """Waits until every rank of `comm` called `meet` with the same `what`.

    Args:
        comm: An mpi4py communicator every rank takes part in.
        what: The call the ranks are in, in words ("hvdkeras.init()").
        value: This rank's contribution (picklable, small).
        timeout_s: The bound; 0 waits for as long as it takes.
        ask: Asks ranks what they are doing (`c_api.ask_ranks`), for the
            timeout's message; None when no engine runs yet.
        say: Tells this rank's watchdog what it waits in (`c_api.set_activity`).

    Returns:
        Every rank's `value`, by rank.

    Raises:
        MeetingError: some rank is in another call, or the bound passed.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    values: Dict[int, Any] = {rank: value}
    if size == 1:
        return [value]
    global _sends
    _sends = [request for request in _sends if not request.Test()]
    for other in range(size):
        if other != rank:
            _sends.append(comm.isend((what, value), dest=other, tag=MEETING_TAG))
    if say:
        say(what)
    start = time.monotonic()
    poll = _FIRST_POLL_S
    try:
        while len(values) < size:
            elsewhere = {}
            for other in range(size):
                if other in values:
                    continue
                message = comm.improbe(source=other, tag=MEETING_TAG)
                if message is None:
                    continue
                their_what, their_value = message.recv()
                if their_what != what:
                    elsewhere[other] = their_what
                values[other] = their_value
            if elsewhere:
                raise MeetingError(diverged_message(what, rank, elsewhere))
            if len(values) == size:
                break
            waited = time.monotonic() - start
            if timeout_s > 0 and waited > timeout_s:
                missing = [r for r in range(size) if r not in values]
                answers = ask(missing, ASK_WAIT_S) if ask else {}
                raise MeetingError(timeout_message(what, rank, waited, sorted(values), missing,
                                                   answers))
            time.sleep(poll)
            poll = min(poll * 2, _LONGEST_POLL_S)
    finally:
        if say:
            say("")
    return [values[r] for r in range(size)]


def meet_with_engine(comm: Any, lib: Any, bound_s: float, what: str, value: Any = None
                     ) -> List[Any]:
    """`meet` once the engine runs: the missing ranks' watchdogs are asked what
    they do, and this rank's tells what it waits in."""
    return meet(comm, what, value, bound_s,
                ask=lambda ranks, wait: c_api.ask_ranks(lib, ranks, wait),
                say=lambda text: c_api.set_activity(lib, text))

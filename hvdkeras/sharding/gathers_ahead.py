"""Which stage-3 gather group a pass reads after which, and the gathers
started ahead of their reads. Framework-free: each backend starts and
finishes its own gathers (torch's in `hvdkeras/backends/torch/group_gathers.py`).

Note [gathers started ahead]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A stage-3 step reads its gather groups in the order its layers run (the
backward pass's regathers in about the reverse order), and each read waits
for the group's allgather. Started only at the read, the allgather leaves
the CPU idle while the bytes move and the link idle while the layer
computes. So each pass's order of first reads is kept (`order`, per kind of
gather), and what it says comes after a group (`next_of`) is started as
soon as that group is read: the layer computes while the next group's
bytes move (FSDP's forward and backward prefetch, one group ahead).

- Names. A gather started ahead carries the name of the gather it stands
  for, so whether a rank starts ahead or not (`HVDKERAS_ZERO3_PREFETCH`)
  does not change which collectives it makes; the ranks' reads must follow
  the same order, as the gathers themselves require.
- The first pass learns the order; later passes use it. A group read twice
  in a pass, or a pass that reads fewer groups, leaves the order as it was
  first seen (no wrap from the last group back to the first). Between two
  changes of the weights a group is started ahead at most once, and only
  before its first read: so every gather started ahead is one that each
  rank reads (or drops) in the same place; of several passes between two
  updates (evaluation), only the first starts gathers ahead.
- Freshness. What is started ahead is this rank's rows as they are then,
  copied; every change to the weights (an update, an assignment) first
  waits for whatever was started and drops it (`drop`), so no stale value
  is read. The wait ends: every rank started the same gather.

What may import this module: `hvdkeras.sharding` and `hvdkeras.backends`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple


class GathersAhead:
    """Which group comes after which, per kind of gather, and the gathers
    started ahead of their reads (Note [gathers started ahead]).

    Args:
        enabled: Whether to start gathers ahead (`HVDKERAS_ZERO3_PREFETCH`).
        drop: Waits for a started gather that no read will use (the
            backend's).

    Example:

    ```python
    ahead = GathersAhead(True, drop=lambda started: started.wait())
    ahead.read("params", 0); ahead.read("params", 3)  # a pass reads 0, then 3
    ahead.drop_all()                                    # an update
    assert ahead.read("params", 0) == 3                 # start 3 now
    ```
    """

    def __init__(self, enabled: bool, drop: Callable[[Any], None]) -> None:
        self.enabled = enabled
        self.drop = drop
        self.started: Dict[Tuple[str, int], Any] = {}
        self.order: Dict[str, List[int]] = {}
        self.next_of: Dict[str, Dict[int, int]] = {}
        self.used = 0  # reads answered by a gather started ahead

    def take(self, what: str, group: int) -> Optional[Any]:
        """The gather started ahead for `group` (its first position), if any."""
        started = self.started.pop((what, group), None)
        if started is not None:
            self.used += 1
        return started

    def read(self, what: str, group: int) -> Optional[int]:
        """Notes that a pass read `group`; returns the group to start next,
        if the order says one comes next and it is not started yet."""
        order = self.order.setdefault(what, [])
        if group not in order:
            if order:
                self.next_of.setdefault(what, {})[order[-1]] = group
            order.append(group)
        following = self.next_of.get(what, {}).get(group)
        if (not self.enabled or following is None or following in order
                or (what, following) in self.started):
            return None  # a group is started ahead at most once between changes
        return following

    def start(self, what: str, group: int, started: Any) -> None:
        """Keeps a gather started ahead for `group` until its read takes it."""
        self.started[(what, group)] = started

    def drop_all(self) -> None:
        """The weights are about to change: waits for what was started
        ahead and forgets it; the next pass records its order afresh."""
        started, self.started = self.started, {}
        for one in started.values():
            self.drop(one)
        self.order = {}

"""Elastic restarts: after a failure, relaunch on the ranks that are available.

An MPI world cannot change size in place, so hvdkeras is elastic by
restarting: when an attempt fails, the launcher works out which slots are
left (the host-discovery script's current answer, or the previous hosts less
the slots whose ranks failed), starts the next attempt on as many ranks as
they hold (at most `max_np`, at least `min_np`), and the training resumes from
its last checkpoint with the world size changed (learning-rate scaling and
data shards follow `hvd.size()`; see Note [exact resume] in
hvdkeras/training/resume_state.py for what the recipes restore). The world
grows again at a later restart when discovery reports more slots.

Pure apart from `discover`, which runs the user's script.

What may import this module: the rest of `hvdkeras.runner` (standard library only).
"""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Optional, Sequence

from hvdkeras.runner.hosts import HostSlots, parse_hosts, total_slots

DISCOVERY_TIMEOUT_S = 60.0
# With elastic flags and no --max-restarts, this many relaunches are allowed.
DEFAULT_ELASTIC_RESTARTS = 3


@dataclasses.dataclass(frozen=True)
class Elastic:
    """The range of world sizes a job accepts, and where the hosts come from.

    Attributes:
        min_np: Fewest ranks the job may run on; fewer available ends it.
        max_np: Most ranks it may run on.
        discovery_script: An executable printing the available hosts, one
            ``host:slots`` (or ``host``) per line; None: the launch hosts,
            less the slots of ranks that failed.
    """

    min_np: int
    max_np: int
    discovery_script: Optional[str] = None

    def __post_init__(self):
        for name in ("min_np", "max_np"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
        if self.min_np > self.max_np:
            raise ValueError(f"--min-np {self.min_np} is more than --max-np {self.max_np}.")


def parse_discovery_output(text: str, script: str) -> list[HostSlots]:
    """Hosts from a discovery script's output (``host:slots`` or ``host`` per line). Pure."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    entries = [line for line in lines if line]
    if not entries:
        return []
    try:
        return parse_hosts(",".join(entries))
    except ValueError as exc:
        raise ValueError(f"host-discovery script {script!r} printed hosts hvdkerasrun cannot "
                         f"read ({exc}); print one 'host:slots' per line.") from None


def discover(script: str) -> list[HostSlots]:
    """Runs the discovery script and returns the hosts it prints."""
    try:
        done = subprocess.run([script], capture_output=True, text=True, timeout=DISCOVERY_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"host-discovery script {script!r} could not run: {exc}") from None
    if done.returncode != 0:
        raise ValueError(f"host-discovery script {script!r} exited with code {done.returncode}: "
                         f"{done.stderr.strip()[-300:]}")
    return parse_discovery_output(done.stdout, script)


def without_failed(hosts: Sequence[HostSlots], failed_hosts: Sequence[str]) -> list[HostSlots]:
    """`hosts` less one slot per failed rank, on the host it ran on. Pure.

    A failure is matched to a host by name; with a single host (a job on one
    machine, which may be named differently by the user and by the rank)
    every failure counts there. A failure on a host not in the list is ignored.
    """
    slots = {h.host: h.slots for h in hosts}
    for host in failed_hosts:
        key = host if host in slots else (hosts[0].host if len(hosts) == 1 else None)
        if key is not None and slots[key] > 0:
            slots[key] -= 1
    return [HostSlots(h, n) for h, n in slots.items() if n > 0]


def hosts_of_ranks(hosts: Sequence[HostSlots], ranks: Sequence[int]) -> list[str]:
    """The host each of `ranks` ran on, with ranks placed on `hosts` in order,
    filling each host's slots before the next (how hvdkerasrun's `-H` and
    hostfile place them, with Hydra and with Open MPI). Ranks past the slots
    are left out. Pure.

    >>> hosts_of_ranks([HostSlots("a", 2), HostSlots("b", 2)], [3, 2])
    ['b', 'b']
    """
    placed = [h.host for h in hosts for _ in range(h.slots)]
    return [placed[r] for r in ranks if 0 <= r < len(placed)]


def fit_world(available: Sequence[HostSlots], elastic: Elastic) -> Optional[list[HostSlots]]:
    """The hosts of the next attempt: `available` trimmed to `max_np` ranks, or
    None when they hold fewer than `min_np`. Pure."""
    if total_slots(list(available)) < elastic.min_np:
        return None
    left, chosen = elastic.max_np, []
    for entry in available:
        if left == 0:
            break
        take = min(entry.slots, left)
        chosen.append(HostSlots(entry.host, take))
        left -= take
    return chosen

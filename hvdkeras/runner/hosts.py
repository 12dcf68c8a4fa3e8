"""Host lists (``-H a:2,b:2``) and hostfiles (``a slots=2``), as in horovodrun.

Pure functions: nothing here starts processes or touches MPI.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

# A host name, an IPv4 address or a bracketed IPv6 address.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)$")


@dataclasses.dataclass(frozen=True)
class HostSlots:
    """One host and how many ranks it takes."""

    host: str
    slots: int


def _check_host(host: str, where: str) -> str:
    if not _HOST.match(host):
        raise ValueError(f"{where}: {host!r} is not a host name or address.")
    return host


def _check_slots(text: str, host: str, where: str) -> int:
    try:
        slots = int(text, 10)
    except ValueError:
        raise ValueError(f"{where}: slots of host {host!r} must be a whole number, got {text!r}.") from None
    if slots < 1:
        raise ValueError(f"{where}: host {host!r} needs at least 1 slot, got {slots}.")
    return slots


def _merge(entries: Iterable[HostSlots]) -> list[HostSlots]:
    """Merges repeated hosts (slots add up), keeping first-seen order."""
    merged: dict[str, int] = {}
    for entry in entries:
        merged[entry.host] = merged.get(entry.host, 0) + entry.slots
    return [HostSlots(host, slots) for host, slots in merged.items()]


def _split_host_slots(item: str, where: str) -> tuple[str, str]:
    """``host:N`` -> (host, N); ``host`` -> (host, "1"); IPv6 must be bracketed."""
    if item.startswith("["):
        match = re.match(r"^(\[[^\]]+\])(?::(.*))?$", item)
        if not match:
            raise ValueError(f"{where}: cannot read {item!r}; write IPv6 hosts as [addr]:slots.")
        return match.group(1), match.group(2) if match.group(2) is not None else "1"
    if item.count(":") > 1:
        raise ValueError(f"{where}: write IPv6 addresses in brackets, e.g. [::1]:2.")
    host, sep, slots = item.partition(":")
    return host, slots if sep else "1"


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parses ``-H`` syntax: ``host1:2,host2:2`` (a host without ``:N`` has 1 slot).

    >>> parse_hosts("a:2,b")
    [HostSlots(host='a', slots=2), HostSlots(host='b', slots=1)]
    """
    where = f"-H {spec!r}"
    items = [item.strip() for item in spec.split(",")]
    if not spec.strip() or any(not item for item in items):
        raise ValueError(f"{where}: expected host:slots entries separated by commas, e.g. a:2,b:2.")
    entries = []
    for item in items:
        host, slots = _split_host_slots(item, where)
        entries.append(HostSlots(_check_host(host, where), _check_slots(slots, host, where)))
    return _merge(entries)


def parse_hostfile_text(text: str, name: str = "hostfile") -> list[HostSlots]:
    """Parses a hostfile: one host per line, ``host slots=N`` (or ``host:N``, or ``host``).

    ``#`` starts a comment; blank lines are skipped; ``max_slots=`` is accepted and ignored.
    """
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{name} line {number}"
        fields = line.split()
        host, slots = _split_host_slots(fields[0], where)
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            if not sep:
                raise ValueError(f"{where}: expected key=value after the host, got {field!r} "
                                 "(write e.g. 'node1 slots=4').")
            if key == "slots":
                slots = value
            elif key not in ("max_slots", "max-slots"):
                raise ValueError(f"{where}: unknown setting {key!r}; only slots=N is understood.")
        entries.append(HostSlots(_check_host(host, where), _check_slots(slots, host, where)))
    if not entries:
        raise ValueError(f"{name} lists no hosts.")
    return _merge(entries)


def parse_hostfile(path: str) -> list[HostSlots]:
    """Reads and parses a hostfile (see `parse_hostfile_text`)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read hostfile {path!r}: {exc.strerror or exc}.") from None
    return parse_hostfile_text(text, name=f"hostfile {path!r}")


def total_slots(hosts: list[HostSlots]) -> int:
    return sum(h.slots for h in hosts)


def hosts_argument(hosts: list[HostSlots]) -> str:
    """``a:2,b:2``: what Hydra's ``-hosts`` and Open MPI's ``-H`` take."""
    return ",".join(f"{h.host}:{h.slots}" for h in hosts)


def hydra_machinefile(hosts: list[HostSlots]) -> str:
    """Hydra machinefile text (``host:N`` per line)."""
    return "".join(f"{h.host}:{h.slots}\n" for h in hosts)


def openmpi_hostfile(hosts: list[HostSlots]) -> str:
    """Open MPI hostfile text (``host slots=N`` per line)."""
    return "".join(f"{h.host} slots={h.slots}\n" for h in hosts)


_LOCAL_NAMES = {"localhost", "127.0.0.1", "[::1]", "localhost.localdomain"}


def is_local_only(hosts: list[HostSlots], local_names: Iterable[str] = ()) -> bool:
    """Whether every host names this machine (then no remote shell is needed)."""
    names = _LOCAL_NAMES | set(local_names)
    return all(h.host in names for h in hosts)

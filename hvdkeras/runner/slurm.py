"""The hosts, slots and rank count of a Slurm allocation, from the variables
Slurm sets inside it (``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``,
``SLURM_NTASKS``), so that ``hvdkerasrun`` and ``hvdkeras train`` inside
``salloc``/``sbatch`` need neither ``-H`` nor ``-np``, and start the ranks on
the allocation's other nodes through Slurm (``srun``), as its nodes need run
no ssh server.

Pure functions of an environment mapping: nothing here runs Slurm.
"""

from __future__ import annotations

import itertools
import re
from typing import Mapping, Optional

from hvdkeras.runner.hosts import HostSlots, hosts_argument

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
NTASKS = "SLURM_NTASKS"


def _split_top_level(text: str) -> list[str]:
    """Splits at commas outside brackets: ``a[1,3],b`` -> ``["a[1,3]", "b"]``."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{NODELIST}={text!r}: unbalanced ']'.")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"{NODELIST}={text!r}: unbalanced '['.")
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_range_list(body: str, text: str) -> list[str]:
    """``01-03,7`` -> ``["01", "02", "03", "7"]`` (zero padding kept)."""
    out = []
    for item in body.split(","):
        low, sep, high = item.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"{NODELIST}={text!r}: cannot read the range {item!r}.")
        if not sep:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"{NODELIST}={text!r}: the range {item!r} runs backwards.")
        width = len(low)
        out.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return out


def expand_nodelist(text: str) -> list[str]:
    """Expands Slurm's compressed host list, in Slurm's order.

    Args:
        text: e.g. ``"node[01-03,07],gpu[1-2]-ib,login"``; several bracket
            groups in one name expand as their product.

    Returns:
        The host names, e.g. ``["node01", "node02", "node03", "node07",
        "gpu1-ib", "gpu2-ib", "login"]``.

    Raises:
        ValueError: naming the variable and what could not be read.

    Example:

    ```python
    expand_nodelist("n[1-2],m")  # ["n1", "n2", "m"]
    ```
    """
    hosts = []
    for part in _split_top_level(text):
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices = [_expand_range_list(p[1:-1], text) if p.startswith("[") else [p]
                   for p in pieces if p]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    if not hosts:
        raise ValueError(f"{NODELIST}={text!r} names no hosts.")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``: tasks on each node, in node order."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(f"{TASKS_PER_NODE}={text!r}: cannot read {item!r} "
                             "(expected N or N(xM) entries separated by commas).")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def in_allocation(env: Mapping[str, str]) -> bool:
    """Whether these variables come from inside a Slurm job."""
    return bool(env.get(JOB_ID, "").strip()) and bool(env.get(NODELIST, "").strip())


def allocation_hosts(env: Mapping[str, str]) -> Optional[list[HostSlots]]:
    """The allocation's hosts with their task slots, or None outside Slurm.

    Example:

    ```python
    allocation_hosts({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                      "SLURM_TASKS_PER_NODE": "2(x2)"})
    # [HostSlots(host="n1", slots=2), HostSlots(host="n2", slots=2)]
    ```
    """
    if not in_allocation(env):
        return None
    hosts = expand_nodelist(env[NODELIST])
    raw = env.get(TASKS_PER_NODE, "").strip()
    slots = expand_tasks_per_node(raw) if raw else [1] * len(hosts)
    if len(slots) != len(hosts):
        raise ValueError(f"{TASKS_PER_NODE}={raw!r} gives {len(slots)} nodes but "
                         f"{NODELIST}={env[NODELIST]!r} names {len(hosts)}.")
    return [HostSlots(host, count) for host, count in zip(hosts, slots) if count > 0]


def allocation_np(env: Mapping[str, str]) -> Optional[int]:
    """``SLURM_NTASKS`` inside an allocation (else the slots' total), or None outside."""
    hosts = allocation_hosts(env)
    if hosts is None:
        return None
    raw = env.get(NTASKS, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{NTASKS}={raw!r} is not a positive whole number.")
        return int(raw)
    return sum(h.slots for h in hosts)


def allocation_launch(env: Mapping[str, str], hosts: Optional[str], hostfile: Optional[str],
                      np: Optional[int], ssh_command: str) -> tuple[Optional[list[HostSlots]],
                                                                    Optional[int], bool]:
    """What a launcher takes from the allocation it runs in. Pure.

    Args:
        env: The launcher's environment.
        hosts, hostfile, np: What the user gave (None: not given).
        ssh_command: The user's --ssh-command ("ssh" when not given).

    Returns:
        (the allocation's hosts when the user named none, else None;
        the rank count, `np` or SLURM_NTASKS; whether other nodes are reached
        through Slurm rather than ssh: inside an allocation whose hosts are
        used, unless the user chose an ssh command).

    Raises:
        ValueError: for Slurm variables that cannot be read.

    Example:

    ```python
    allocation_launch({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
                       "SLURM_NTASKS": "2"}, None, None, None, "ssh")
    # ([HostSlots("n1", 1), HostSlots("n2", 1)], 2, True)
    ```
    """
    found = None if hosts or hostfile else allocation_hosts(env)
    if np is None:
        np = allocation_np(env)
    return found, np, bool(found) and ssh_command == "ssh"


def train_launch(env: Mapping[str, str], args) -> tuple[Optional[str], int, bool]:
    """(hosts, np, through_slurm) for `hvdkeras train` (`args`: its parsed
    options, with `np` None when not given): the allocation's hosts and
    tasks inside Slurm when there is more than one rank, else what the user
    gave with one rank by default. Ray places its own ranks. Pure."""
    if getattr(args, "engine", None) == "ray":
        return args.hosts, 1 if args.np is None else args.np, False
    found, np, through_slurm = allocation_launch(env, args.hosts, args.hostfile, args.np,
                                                 args.ssh_command)
    np = 1 if np is None else np
    if found and np > 1:
        return hosts_argument(found), np, through_slurm
    return args.hosts, np, False

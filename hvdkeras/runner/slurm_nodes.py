"""What Slurm says of the allocation's nodes when a job inside it fails.

A node whose `slurmd` dies, or that drops off the network, is marked not
responding and then DOWN by `slurmctld`, which then ends the whole job:
the ranks on the other nodes are killed by Slurm, and the first one to go
would otherwise be reported as the failure. Asking `sinfo` about the
allocation's nodes at that moment names the node that was lost.

`troubled_nodes` reads sinfo's output (pure); `node_trouble` runs it, with
a bound, and says nothing when Slurm cannot be asked.
"""

from __future__ import annotations

import subprocess
from typing import List, Mapping, NamedTuple, Optional

from hvdkeras.runner.slurm import NODELIST, expand_nodelist, in_allocation

SINFO_TIMEOUT_S = 10
# sinfo's long states that mean the node cannot run the job's ranks; a
# trailing "*" means not responding, whatever the state.
BAD_STATES = ("down", "drain", "fail", "unknown", "no_respond", "power_down")
FORMAT = "%N|%T|%E"


class NodeTrouble(NamedTuple):
    node: str
    state: str
    reason: str


def troubled_nodes(sinfo_output: str) -> List[NodeTrouble]:
    """The nodes of `sinfo -h -N -o "%N|%T|%E"` output that are not usable.

    Example: `troubled_nodes("h0|allocated|none\\nh2|down*|Not responding")`
    gives `[NodeTrouble("h2", "down*", "Not responding")]`.
    """
    found: List[NodeTrouble] = []
    for line in sinfo_output.splitlines():
        node, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        state = state.strip().lower()
        if not node or not state:
            continue
        if state.endswith("*") or state.rstrip("*~#$@+").startswith(BAD_STATES):
            if all(t.node != node for t in found):
                found.append(NodeTrouble(node, state, reason.strip()
                                         if reason.strip().lower() != "none" else ""))
    return found


def node_trouble(env: Mapping[str, str], run=subprocess.run) -> Optional[str]:
    """Inside a Slurm allocation, a sentence naming its nodes that Slurm
    counts as lost (down, not responding, failed, drained), or None (none
    are, not in an allocation, or sinfo could not be asked in time)."""
    if not in_allocation(env):
        return None
    try:
        nodes = expand_nodelist(env[NODELIST])
        result = run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", FORMAT],
                     capture_output=True, text=True, timeout=SINFO_TIMEOUT_S,
                     stdin=subprocess.DEVNULL)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    troubles = troubled_nodes(result.stdout) if result.returncode == 0 else []
    if not troubles:
        return None
    said = ", ".join(f"{t.node} ({t.state}{': ' + t.reason if t.reason else ''})"
                     for t in troubles)
    return (f"Slurm counts node(s) {said} of this job's allocation as lost: it ends the job "
            "itself, so ranks on the other nodes may be reported killed first")

"""Naming the rank that failed first, from the ranks' status records. Pure.

What may import this module: the rest of `hvdkeras.runner` and
`hvdkeras.spark` (standard library only).
"""

from __future__ import annotations

import signal
from typing import Callable, Optional

from hvdkeras.engine.failfast import is_casualty
from hvdkeras.runner.rank_shim import TAIL_LINES


def describe_failure(record: dict) -> str:
    """"rank R [on HOST] exited with code C" or "... was killed by signal S"."""
    where = f" on {record['host']}" if record.get("host") else ""
    if record.get("signal"):
        return f"rank {record['rank']}{where} was killed by signal {record['signal']}"
    if record.get("reason"):  # the rank ended the job itself (Note [failure record])
        return (f"rank {record['rank']}{where} failed with {record['reason']} and ended the job "
                f"(exit code {record.get('exit_code')})")
    return f"rank {record['rank']}{where} exited with code {record.get('exit_code')}"



def first_failure(records: list[dict], text_of: Callable[[dict], str]) -> list[dict]:
    """`records` reordered so that the rank that failed first on its own comes first.

    Records are ordered by time, except that ranks whose failure only reports
    that the engine was shut down by another rank go after the others (a rank
    exiting with an error can take longer to finish than its peers take to notice),
    and so do ranks that found their own host cut off from rank 0's (`cut_off`:
    rank 0's record names the lost host; Note [host liveness] in ops/core/liveness.h).
    """
    ordered = sorted(records, key=lambda r: r.get("time", 0.0))
    return sorted(ordered, key=lambda r: (is_casualty(text_of(r)), bool(r.get("cut_off"))))


def failure_report(records: list[dict], mpiexec_code: int, tails: dict,
                   lost: Optional[list[dict]] = None,
                   vanished: Optional[list[tuple[int, str]]] = None) -> tuple[str, int]:
    """(message, exit code) for a failed attempt from the ranks' status records.

    Pure. The earliest record names the rank that failed first. Without any,
    ranks that left no trace at all (`vanished`: (rank, host) pairs, neither
    a record nor a lost supervisor's mark, while others were ended) come
    first: their supervisor and its witness died with them, which is what a
    lost host (or a node daemon that takes its processes along) does. Then
    the supervisor that was killed first (`lost`, earliest first: see
    rank_shim.read_lost) is named with its rank; without
    those either (a rank on a host whose files we do not see), mpiexec's code
    is used.
    """
    if not records and lost and vanished:
        code = mpiexec_code if mpiexec_code > 0 else (128 - mpiexec_code if mpiexec_code < 0 else 1)
        hosts = sorted({host for _, host in vanished if host})
        ranks = ", ".join(str(rank) for rank, _ in vanished)
        where = f" on {', '.join(hosts)}" if hosts else ""
        ended = ", ".join(str(m.get("rank")) for m in sorted(lost, key=lambda m: m.get("time", 0)))
        message = (f"rank(s) {ranks}{where} vanished without a trace (the rank, its supervisor "
                   f"and its witness all died at once: the host, or every process of the job "
                   f"on it, was lost); then mpiexec ended rank(s) {ended} "
                   f"(mpiexec exited with code {mpiexec_code})")
        return message, code
    if records:
        records = first_failure(records, lambda r: "\n".join(r.get("last_lines") or []))
        first = records[0]
        lines = first.get("last_lines") or list(tails.get(str(first["rank"]), []))
        code = first.get("exit_code")
        if code is None or code == 0:
            try:
                code = 128 + signal.Signals[first.get("signal") or ""].value
            except KeyError:
                code = 1
        message = describe_failure(first)
        others = [str(r["rank"]) for r in records[1:]]
        if others:
            message += f" (then rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too)"
    elif lost:
        code = mpiexec_code if mpiexec_code > 0 else (128 - mpiexec_code if mpiexec_code < 0 else 1)
        lost = sorted(lost, key=lambda m: m.get("time", 0.0))
        first = lost[0]
        message = (f"the supervisor of rank {first.get('rank')} (pid {first.get('pid')} on "
                   f"{first.get('host')}) was killed, so the rank could not report "
                   f"(mpiexec exited with code {mpiexec_code})")
        others = [str(m.get("rank")) for m in lost[1:]]
        if others:
            message += f"; then mpiexec ended rank{'s' if len(others) > 1 else ''} {', '.join(others)}"
        lines = list(tails.get(str(first.get("rank")), []))
    else:
        code = mpiexec_code if mpiexec_code > 0 else (128 - mpiexec_code if mpiexec_code < 0 else 1)
        message = f"mpiexec exited with code {mpiexec_code} and no rank reported a failure"
        lines = list(tails.get("mpiexec", []))
    if lines:
        who = (f"rank {records[0]['rank']}" if records
               else f"rank {lost[0].get('rank')}" if lost else "mpiexec")
        message += f"\nlast lines of {who}:\n" + "\n".join(f"    {line}" for line in lines[-TAIL_LINES:])
    return message, code

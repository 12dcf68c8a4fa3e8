"""What the cluster tests on the network lab share (tests/test_spark_cluster.py,
tests/test_ray_cluster.py): a driver process on this machine, run to its end
with a bound, and a rank's host lost under it."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from mpi_runner import _kill_group, tail

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import netlab  # noqa: E402


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """The driver's output once it ends; kills it and fails after `timeout`."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise AssertionError(f"the driver did not finish in {timeout} s:\n"
                             f"{tail(proc.communicate(timeout=10)[0])}") from None
    return out


def lose_a_rank_host(proc: subprocess.Popen, ready_dir: Path, lab_name: str, spared: str,
                     liveness_s: float, what: str, ranks: int = 3) -> None:
    """Waits until every rank wrote READY_DIR/ready.<rank> (its host), crashes
    the host of a rank other than 0 that is neither rank 0's nor `spared`
    (the scheduler's head), and checks that the driver's run ended within the
    liveness bound plus 40 s with an error naming that host and rank."""
    deadline = time.monotonic() + 240
    while len(list(ready_dir.glob("ready.[0-9]"))) < ranks and time.monotonic() < deadline:
        assert proc.poll() is None, tail(proc.communicate()[0])
        time.sleep(0.5)
    placed = {int(p.suffix[1:]): p.read_text() for p in ready_dir.glob("ready.[0-9]")}
    if len(placed) < ranks:  # what the driver printed says where the ranks stopped
        _kill_group(proc)
        raise AssertionError(f"{len(placed)} of {ranks} ranks were ready after 240 s "
                             f"({placed}); the driver printed:\n"
                             f"{tail(proc.communicate(timeout=10)[0])}")
    lost_rank, lost = next((r, h) for r, h in sorted(placed.items())
                           if r != 0 and h not in (placed[0], spared))
    killed = netlab.crash(lab_name, lost)
    crashed_at = time.monotonic()
    out = finish(proc, 200)
    took = time.monotonic() - crashed_at
    print(f"\nlost {what} host {lost} ({killed} processes killed): the run ended "
          f"{took:.1f} s later")
    print(next((line for line in out.splitlines() if line.startswith("FAILED")), ""))
    assert re.search(rf"FAILED after .*host\(s\) {lost} \(rank\(s\) {lost_rank}\) sent nothing",
                     out, re.S), tail(out)
    assert "UNREACHABLE" not in out
    assert took < liveness_s + 40, took

"""The Chrome-trace timeline written by rank 0 (HVDKERAS_TIMELINE, start_timeline).

Launches 2-rank jobs of tests/scripts/timeline_job.py and parses the trace
with `json.load`. In the trace each tensor name is a process (a
"process_name" metadata event); per tensor there is a NEGOTIATE_<OP>
duration with one "rank N ready" instant per rank, then an <OP> duration
(args: dtype and shape) holding the execution phases (MPI_ALLREDUCE, ...;
MEMCPY_IN_FUSION_BUFFER before it when a buffer is fused, then
MEMCPY_OUT_FUSION_BUFFER, or ADOPT_OUTPUTS for an allreduce whose outputs
are slices of the fused buffer).

The last test SIGKILLs a running job and checks the file still parses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from mpi_runner import _child_env, describe, mpiexec_path, run_under_mpi, tail

SCRIPT = Path(__file__).resolve().parent / "scripts" / "timeline_job.py"
JOB_TIMEOUT_S = 240
STEPS = 3

pytestmark = [pytest.mark.usefixtures("op_library_built"),
              pytest.mark.slow, pytest.mark.timeout(JOB_TIMEOUT_S + 120)]



# ---------------------------------------------------------------- parsing

class Trace:
    """A parsed trace: events grouped by tensor (process) name, in file order."""

    def __init__(self, path: Path):
        with open(path) as f:
            self.events = json.load(f)
        assert isinstance(self.events, list), type(self.events)
        self.names = {}  # pid -> tensor name
        for e in self.events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                assert e["pid"] not in self.names, f"pid {e['pid']} named twice"
                self.names[e["pid"]] = e["args"]["name"]
        self.by_tensor = defaultdict(list)
        for e in self.events:
            if e.get("ph") != "M":
                assert e["pid"] in self.names, f"event for an unnamed process: {e}"
                assert isinstance(e["ts"], int) and e["ts"] >= 0, e
                self.by_tensor[self.names[e["pid"]]].append(e)

    def spans(self, tensor: str, complete: bool = True) -> list[dict]:
        """The B/E pairs of one tensor, nested by a stack in file order.

        Each span: {"name", "begin", "end", "args", "depth", "instants"} with
        the instant events that fell inside it (at its own depth).
        """
        stack, done = [], []
        for e in self.by_tensor[tensor]:
            if e["ph"] == "B":
                stack.append({"name": e["name"], "begin": e["ts"], "args": e.get("args"),
                              "depth": len(stack), "instants": []})
            elif e["ph"] == "E":
                assert stack, f"{tensor}: an end event without a begin: {e}"
                span = stack.pop()
                span["end"] = e["ts"]
                assert span["end"] >= span["begin"], f"{tensor}: {span} ends before it begins"
                done.append(span)
            elif e["ph"] == "i":
                assert stack, f"{tensor}: an instant outside any span: {e}"
                assert e.get("s") == "p", e
                stack[-1]["instants"].append(e)
            else:
                raise AssertionError(f"unexpected event phase: {e}")
        if complete:
            assert not stack, f"{tensor}: spans never ended: {stack}"
        return sorted(done, key=lambda s: (s["begin"], s["depth"]))


def negotiations(trace: Trace, tensor: str, op: str) -> list[dict]:
    return [s for s in trace.spans(tensor) if s["name"] == f"NEGOTIATE_{op}"]


def check_tensor(trace: Trace, tensor: str, op: str, phases: list, dtype: str,
                 shape: str, ranks: int = 2, times: int = STEPS) -> None:
    """`tensor` was negotiated and run `times` times, with `phases` inside each run.

    `phases` is one list of phase names, or a list of such lists when each run
    may show any one of them.
    """
    allowed = phases if phases and isinstance(phases[0], list) else [phases]
    assert tensor in trace.names.values(), (
        f"no process_name for {tensor!r}; have {sorted(trace.names.values())}")
    spans = trace.spans(tensor)
    negos = [s for s in spans if s["name"] == f"NEGOTIATE_{op}"]
    runs = [s for s in spans if s["name"] == op]
    assert len(negos) == times and len(runs) == times, (
        f"{tensor}: {len(negos)} negotiations and {len(runs)} runs, expected {times} each: "
        f"{[s['name'] for s in spans]}")
    for nego, run in zip(negos, runs):
        assert nego["depth"] == 0 and run["depth"] == 0, (nego, run)
        ready = sorted(e["name"] for e in nego["instants"])
        assert ready == [f"rank {r} ready" for r in range(ranks)], f"{tensor}: {ready}"
        for e in nego["instants"]:
            assert e["args"]["rank"] == int(e["name"].split()[1]), e
            assert nego["begin"] <= e["ts"] <= nego["end"], (nego, e)
        assert nego["end"] <= run["begin"], f"{tensor}: ran before negotiation ended"
        assert run["args"] == {"dtype": dtype, "shape": shape}, f"{tensor}: {run['args']}"
        inside = [s["name"] for s in spans
                  if s["depth"] == 1 and run["begin"] <= s["begin"] <= s["end"] <= run["end"]]
        assert inside in allowed, f"{tensor}: phases {inside}, expected one of {allowed}"


def run_job(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    result = run_under_mpi(2, [str(SCRIPT), *args], timeout=JOB_TIMEOUT_S, env=env)
    assert result.returncode == 0, describe(result)
    assert [rank.stdout.count(" done") for rank in result.ranks] == [1, 1], describe(result)
    return result


# ---------------------------------------------------------------- tests

def test_timeline_from_env(tmp_path):
    """HVDKERAS_TIMELINE: every named tensor's negotiation and phases are in the trace."""
    path = tmp_path / "timeline.json"
    run_job(["env", str(STEPS)], env={"HVDKERAS_TIMELINE": str(path),
                                      "HVDKERAS_TIMELINE_MARK_CYCLES": "1"})
    trace = Trace(path)
    # A lone tensor goes straight to MPI; a group is copied into a fused
    # buffer whose slices then become the outputs.
    check_tensor(trace, "tl_single", "ALLREDUCE", ["MPI_ALLREDUCE"], "float32", "[4]")
    fusion = ["MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "ADOPT_OUTPUTS"]
    check_tensor(trace, "tl_grouped", "ALLREDUCE", fusion, "float32,float32", "[3],[2, 2]")
    check_tensor(trace, "tl_gather", "ALLGATHER", ["MPI_ALLGATHER"], "int32", "[1, 2]")
    check_tensor(trace, "tl_bcast", "BROADCAST", ["MPI_BCAST"], "int32", "[5]")
    check_tensor(trace, "tl_alltoall", "ALLTOALL", ["MPI_ALLTOALL"], "int32", "[4]")
    # On one host the reduce-scatter folds through shared memory (Note [one
    # summation order on a host] in ops/core/collectives.h).
    check_tensor(trace, "tl_rs", "REDUCESCATTER",
                 ["MEMCPY_IN_FUSION_BUFFER", "SHM_REDUCE_SCATTER", "MEMCPY_OUT_FUSION_BUFFER"],
                 "float32", "[4, 3]")
    # Separate ops of one tf.function: fused when they happen to be ready in
    # the same engine cycle (copied through the buffer), else each runs alone;
    # which one can differ from step to step.
    fused = [n for n in trace.names.values() if "fused_" in n]
    assert len(fused) == 4, sorted(trace.names.values())
    for name in fused:
        check_tensor(trace, name, "ALLREDUCE", [fusion, ["MPI_ALLREDUCE"]], "float32", "[8]")
    # Cycle markers are instants of their own process.
    cycles = [e for e in trace.by_tensor["(engine cycles)"] if e["name"] == "CYCLE_START"]
    assert len(cycles) >= STEPS, len(cycles)


def test_timeline_started_and_stopped_at_run_time(tmp_path):
    """start_timeline/stop_timeline trace exactly the ops run in between."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    run_job(["runtime", str(first), str(second)])
    trace = Trace(first)
    tensors = set(trace.names.values())
    assert {"on_single", "on_grouped", "on_gather", "on_bcast", "on_alltoall", "on_rs"} <= tensors
    assert not [t for t in tensors if t.startswith(("off_", "second_"))], tensors
    check_tensor(trace, "on_single", "ALLREDUCE", ["MPI_ALLREDUCE"], "float32", "[4]", times=2)
    trace2 = Trace(second)
    tensors2 = set(trace2.names.values())
    assert "second_single" in tensors2 and "(engine cycles)" in tensors2, tensors2
    assert not [t for t in tensors2 if t.startswith(("off_", "on_"))], tensors2
    check_tensor(trace2, "second_gather", "ALLGATHER", ["MPI_ALLGATHER"], "int32", "[1, 2]",
                 times=1)


def read_log(log) -> str:
    log.flush()
    log.seek(0)
    return tail(log.read())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_timeline_parses_after_sigkill(tmp_path):
    """Kill the whole job mid-run: the trace written so far is still valid JSON."""
    path = tmp_path / "killed.json"
    cmd = [str(mpiexec_path()), "-n", "2", sys.executable, str(SCRIPT), "forever", "100000"]
    log = open(tmp_path / "job.log", "w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_child_env({"HVDKERAS_TIMELINE": str(path),
                                              "HVDKERAS_EXPECTED_SIZE": "2"}),
                            start_new_session=True)
    seen, parses, torn = 0, 0, 0
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the job ended on its own:\n" + read_log(log)
            time.sleep(0.2)
            if not path.exists():
                continue
            # Reading while rank 0 appends can catch a write half done (a
            # reader-side race, not the file's state), so a failed parse
            # mid-run is counted, not fatal; the check after the kill is strict.
            try:
                trace = Trace(path)
            except json.JSONDecodeError:
                torn += 1
                continue
            parses += 1
            seen = len([s for s in trace.spans("kill_single", complete=False)
                        if s["name"] == "NEGOTIATE_ALLREDUCE"])
            if seen >= 20 and parses >= 3:
                break
        else:
            raise AssertionError("the trace never showed 20 steps:\n" + read_log(log))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # Nothing of the job survives the kill (every rank was in the process group).
    for _ in range(50):
        if not _group_alive(proc.pid):
            break
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "processes of the killed job are still running"
    log.close()

    trace = Trace(path)  # strict: must parse
    negos = [s for s in trace.spans("kill_single", complete=False)
             if s["name"] == "NEGOTIATE_ALLREDUCE"]
    assert len(negos) >= seen, (len(negos), seen)
    assert parses >= 3 and torn <= parses, (parses, torn)
    with open(path) as f:
        text = f.read()
    assert text.rstrip().endswith("]"), text[-200:]

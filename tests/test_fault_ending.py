"""Every failed job ends, whole, within a bound, naming the rank: real faults on 2 ranks.

* a rank that raises while the other computes outside a collective ends the
  job at once (Note [abort, not finalize] in hvdkeras/engine/failfast.py);
* a rank that hangs inside a Keras callback ends the job once the stall
  shutdown fails the collective the other rank waits in (Note [hang bound]),
  naming the collective and the missing rank;
* a rank whose process stops (SIGSTOP) ends the job once the other rank's
  engine has waited the stall bound in one negotiation (Note [bounded
  waits] in ops/core/watchdog.h), naming the rank that no longer answers;
* a SIGKILLed rank ends the job, named, with nothing left;
* SIGKILL to `hvdkerasrun` itself leaves no process behind (checked by a
  marker in the environment of everything it started);
* SIGKILL to a rank's supervisor (the shim) is reported with its rank.

The pure parts (the switch, exit codes, records, the report) are tested first.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from hvdkeras.engine import config, failfast
from hvdkeras.runner import failures, rank_shim, restart
from mpi_runner import _child_env, _kill_group

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FAULTS = TESTS / "launcher_scripts" / "faults.py"
HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"
TIMEOUT = 240
# From the failure (or the kill) to the end of every process. Measured here:
# 0.1-0.2 s for a raise, under 1 s for a killed launcher or supervisor; the
# bound leaves room for a loaded 2-core machine.
ENDS_WITHIN_S = 15.0
STALL_SHUTDOWN_S = 5

pytestmark = pytest.mark.usefixtures("op_library_built")


# --- pure parts ---------------------------------------------------------------

def test_abort_is_on_for_several_ranks_unless_turned_off():
    assert failfast.enabled(2, {}) and failfast.enabled(3, {config.ABORT_ON_ERROR: "1"})
    assert not failfast.enabled(1, {})
    assert not failfast.enabled(2, {config.ABORT_ON_ERROR: "0"})
    with pytest.raises(ValueError, match="HVDKERAS_ABORT_ON_ERROR='maybe' is not a boolean"):
        failfast.enabled(2, {config.ABORT_ON_ERROR: "maybe"})
    assert failfast.exit_code_for(RuntimeError) == 1
    assert failfast.exit_code_for(KeyboardInterrupt) == 130


def test_the_record_a_rank_writes_is_what_the_launcher_reads(tmp_path, monkeypatch):
    """Note [failure record]: failfast (engine layer) and the shim agree on name and format."""
    assert failfast.FAILURE_RECORD_ENV == rank_shim.FAILURE_RECORD_ENV
    assert failfast.RECORD_LINES == rank_shim.TAIL_LINES
    monkeypatch.setenv(failfast.FAILURE_RECORD_ENV, rank_shim.status_path(str(tmp_path), "1"))
    monkeypatch.setenv(restart.ATTEMPT_ENV, "2")
    record = failfast.failure_record(1, 1, "an uncaught ValueError",
                                     [f"line {i}" for i in range(30)] + ["ValueError: bad"])
    failfast._write_record(record)
    [read] = rank_shim.read_statuses(str(tmp_path))
    assert read["rank"] == "1" and read["attempt"] == 2 and read["exit_code"] == 1
    assert read["last_lines"][-1] == "ValueError: bad" and len(read["last_lines"]) == 20
    message, code = failures.failure_report([read], 1, {})
    assert code == 1
    assert message.startswith("rank 1 on ") and "failed with an uncaught ValueError and ended the "
    assert "ended the job (exit code 1)" in message and "ValueError: bad" in message


DRAIN_CHILD = """
import sys, time
from hvdkeras.engine import failfast
print("x" * 1000, flush=True)
started = time.monotonic()
drained = failfast.wait_for_readers(limit_s=float(sys.argv[1]))
print("DRAINED" if drained else "NOT DRAINED", round(time.monotonic() - started, 2), flush=True)
"""


@pytest.mark.parametrize("reader_reads", [True, False])
def test_a_failing_rank_waits_until_its_last_lines_were_read(reader_reads):
    """Before the abort kills everything, the lines a failing rank printed
    leave its output pipe (failfast.wait_for_readers), for as long as the
    reader takes them, and no longer than the limit when it does not."""
    proc = subprocess.Popen([sys.executable, "-c", DRAIN_CHILD, "0.5"], stdout=subprocess.PIPE,
                            env=_child_env(None))
    try:
        if reader_reads:
            out = proc.communicate(timeout=60)[0].decode()
            assert "x" * 1000 in out and "\nDRAINED" in out, out
        else:
            time.sleep(3)  # the child's limit passes while its line sits in the pipe
            out = proc.communicate(timeout=60)[0].decode()
            assert "NOT DRAINED" in out, out
            assert float(out.split()[-1]) < 1.5, out  # bounded
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_first_killed_supervisor_is_named():
    lost = [{"rank": "0", "pid": 11, "host": "h", "time": 5.2},
            {"rank": "1", "pid": 12, "host": "h", "time": 5.0}]
    message, code = failures.failure_report([], 9, {"1": ["[1]<stdout>: step 3"]}, lost)
    assert code == 9
    assert message.startswith("the supervisor of rank 1 (pid 12 on h) was killed"), message
    assert "then mpiexec ended rank 0" in message and "step 3" in message
    # Failure records win over lost supervisors (those are then the casualties).
    record = {"rank": "0", "exit_code": 3, "signal": None, "time": 6.0, "last_lines": []}
    assert failures.failure_report([record], 3, {}, lost)[0].startswith("rank 0 exited with code 3")


# --- real jobs ----------------------------------------------------------------

def _start(args, marker, **env):
    """Starts `hvdkerasrun` (own session), every process it starts carrying `marker`."""
    full = {"PATH": f"{HVDKERASRUN.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "HVDKERAS_TEST_MARKER": marker, **env}
    return subprocess.Popen([str(HVDKERASRUN), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", env=_child_env(full), cwd=REPO, start_new_session=True)


def _marked(marker):
    """Pids of live processes whose environment holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"HVDKERAS_TEST_MARKER={marker}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _read_until(proc, pattern, lines, timeout=TIMEOUT):
    """Reads `proc`'s output into `lines` until every rank printed a line matching `pattern`."""
    deadline = time.monotonic() + timeout
    seen = {}
    while time.monotonic() < deadline and len(seen) < 2:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(pattern, line)
        if match:
            seen[match.group(1)] = match
    assert len(seen) == 2, "".join(lines[-40:])
    return seen


def _finish(proc, lines, timeout=TIMEOUT):
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise AssertionError("the job did not end:\n" + "".join(lines[-40:]))
    lines.append(rest)
    return "".join(lines)


def _wait_gone(marker, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _marked(marker):
            return True
        time.sleep(0.1)
    return False


def _kill_while_waiting(marker, victim):
    """Starts a 2-rank job that waits, SIGKILLs `victim(rank 1's pid)` and lets the job end.

    Returns (the launcher process, the pid killed, the output, seconds from the kill to the end).
    """
    proc = _start(["-np", 2, sys.executable, FAULTS, "wait"], marker)
    lines = []
    ready = _read_until(proc, r"READY (\d+) (\d+) ", lines)
    pid = victim(int(ready["1"].group(2)))
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    output = _finish(proc, lines)
    return proc, pid, output, time.time() - killed_at


@pytest.fixture
def marker():
    value = uuid.uuid4().hex
    yield value
    for pid in _marked(value):  # never leave anything behind, even when a test fails
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_rank_that_raises_ends_the_job_while_another_computes(marker):
    proc = _start(["-np", 2, sys.executable, FAULTS, "raise"], marker)
    output = _finish(proc, [])
    ended = time.time()
    assert proc.returncode == 1, output
    failed_at = float(re.search(r"FAILING_AT (\d+\.\d+)", output).group(1))
    assert ended - failed_at < ENDS_WITHIN_S, output  # rank 0 would compute for 300 s
    assert re.search(r"attempt 1 of 1 failed after .*: rank 1 on \S+ failed with an uncaught "
                     r"RuntimeError and ended the job \(exit code 1\)", output), output
    assert re.search(r"last lines of rank 1:(\n\s+.*)*\n\s+RuntimeError: rank 1 broke right after init",
                     output), output
    assert "UNREACHABLE" not in output
    assert _wait_gone(marker, 5.0), _marked(marker)


@pytest.mark.slow
@pytest.mark.light  # the job mostly waits for the hang to be noticed
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_rank_that_hangs_in_a_callback_ends_the_job(marker):
    proc = _start(["-np", 2, "--stall-shutdown-seconds", STALL_SHUTDOWN_S, sys.executable, FAULTS,
                   "hang"], marker)
    output = _finish(proc, [])
    ended = time.time()
    assert proc.returncode == 1, output
    hung_at = float(re.search(r"HANGING_AT (\d+\.\d+)", output).group(1))
    assert ended - hung_at < STALL_SHUTDOWN_S + ENDS_WITHIN_S, output
    # Rank 1, waiting in the gradient allreduce, names the collective and the missing rank.
    assert re.search(r"failed after .*: rank 1 on \S+ failed with an uncaught \w+Error", output), output
    assert re.search(r"Collective '[^']+' stalled for [\d.]+ s: rank\(s\) 0 never submitted it "
                     r"\(rank\(s\) 1 did\)", output), output
    assert "UNREACHABLE" not in output
    assert _wait_gone(marker, 5.0), _marked(marker)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_stopped_rank_ends_the_job(marker):
    proc = _start(["-np", 2, "--stall-shutdown-seconds", STALL_SHUTDOWN_S, sys.executable, FAULTS,
                   "stop"], marker)
    output = _finish(proc, [])
    ended = time.time()
    assert proc.returncode != 0, output
    stopped_at = float(re.search(r"STOPPING_AT (\d+\.\d+)", output).group(1))
    assert ended - stopped_at < STALL_SHUTDOWN_S + ENDS_WITHIN_S, output
    # Rank 0's engine waited in one negotiation past the bound; rank 1 did not answer.
    assert re.search(r"rank 0's engine has stayed [\d.]+ s in one step, longer than "
                     r"HVDKERAS_STALL_SHUTDOWN_SECONDS \(5.0 s\): global set: negotiating which "
                     r"collectives are ready for [\d.]+ s; in flight here: 1 collective\(s\) "
                     r"\('after'\)\. .* Rank\(s\) 1 did not answer\.", output), output
    assert re.search(r"rank 1: no answer within [\d.]+ s \(its process is stopped or gone", output), output
    # The launcher names the rank that ended the job and the one that went silent.
    assert re.search(r"rank 0 on \S+ failed with a wait past HVDKERAS_STALL_SHUTDOWN_SECONDS "
                     r"\(rank\(s\) 1 did not answer\)", output), output
    assert "UNREACHABLE" not in output
    assert _wait_gone(marker, 5.0), _marked(marker)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_killed_launcher_leaves_no_process(marker):
    proc = _start(["-np", 2, sys.executable, FAULTS, "wait"], marker)
    lines = []
    _read_until(proc, r"READY (\d+) ", lines)
    started = _marked(marker)
    # the launcher, mpiexec, its proxy, 2 shims with their witnesses and 2 ranks
    assert len(started) >= 7, started
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    gone = _wait_gone(marker, ENDS_WITHIN_S)
    took = time.monotonic() - killed_at
    left = _marked(marker)
    proc.communicate(timeout=30)
    assert gone, f"still running {took:.1f} s after the launcher was killed: {left}"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_killed_rank_ends_the_job_and_leaves_no_process(marker):
    proc, _, output, took = _kill_while_waiting(marker, lambda rank_pid: rank_pid)
    assert took < ENDS_WITHIN_S, output
    assert proc.returncode == 128 + signal.SIGKILL, output
    assert re.search(r"failed after .*: rank 1 on \S+ was killed by signal SIGKILL", output), output
    assert _wait_gone(marker, 5.0), _marked(marker)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_a_killed_supervisor_is_named_with_its_rank(marker):
    def parent_of(pid):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])

    proc, shim_pid, output, took = _kill_while_waiting(marker, parent_of)
    assert took < ENDS_WITHIN_S, output
    assert proc.returncode != 0, output
    assert re.search(rf"failed after .*: the supervisor of rank 1 \(pid {shim_pid} on \S+\) was "
                     r"killed, so the rank could not report", output), output
    assert "no rank reported a failure" not in output
    assert _wait_gone(marker, 5.0), _marked(marker)

"""`hvdkerasrun` end to end: real mpiexec, real ranks, real failures.

* the documented example runs; output is rank-prefixed; knobs reach the engine;
* ``-H localhost:2`` and a hostfile (what a single machine allows of multi-host);
* fail-fast: a rank's ``os._exit(3)`` or SIGKILL while the other waits in an
  allreduce ends the job in < 30 s, naming the rank and its code or signal;
* ``--max-restarts 2`` with a script failing on its first attempt only;
* a launcher of another MPI is refused; N worlds of size 1 are caught; and
  the launcher ends the ranks itself when a launcher does not.

Every job runs in its own process group under a timeout that kills the group.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from mpi_runner import describe, run_command

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SCRIPTS = TESTS / "launcher_scripts"
BIN = Path(sys.executable).parent
HVDKERASRUN = BIN / "hvdkerasrun"
TIMEOUT = 240
FAIL_FAST_LIMIT_S = 30.0



pytestmark = pytest.mark.usefixtures("op_library_built")


def _env(**extra):
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "HVDKERAS_RESTART_BACKOFF_SECONDS": "0.5"}
    env.update(extra)
    return env


def _run(args, timeout=TIMEOUT, cwd=REPO, **env):
    return run_command([str(HVDKERASRUN), *map(str, args)], timeout=timeout, env=_env(**env), cwd=cwd)


def _engine_lines(output):
    found = {}
    for line in output.splitlines():
        match = re.match(r"^\[(\d+)\]<stdout>: ENGINE (\{.*\})$", line)
        if match:
            found[int(match.group(1))] = json.loads(match.group(2))
    return found


def _documented_command():
    """The example command line of the README / docs/launching.md (the test runs exactly that)."""
    lines = set()
    for doc in (REPO / "README.md", REPO / "docs" / "launching.md"):
        if doc.exists():
            lines |= {l.strip() for l in doc.read_text().splitlines()
                      if l.strip().startswith("hvdkerasrun -np 2") and "examples/engine_knobs.py" in l}
    assert len(lines) == 1, f"expected one documented engine_knobs.py command, found {sorted(lines)}"
    return lines.pop().split()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_documented_example_prefixes_output_and_knobs_reach_the_engine():
    command = _documented_command()
    result = run_command(command, timeout=TIMEOUT, env=_env(), cwd=REPO)
    assert result.returncode == 0, describe(result)
    out = result.stdout
    for rank in (0, 1):
        assert re.search(rf"^\[{rank}\]<stdout>: rank {rank} of 2: fusion_threshold=2097152 bytes, "
                         r"cycle_time_ms=3\.5,", out, re.M), describe(result)
        assert f"[{rank}]<stdout>: sum of ranks: 1" in out
    # What the ranks printed never appears without its prefix.
    for line in out.splitlines():
        assert not re.match(r"^(rank \d of 2|sum of ranks)", line), line
    assert "hvdkerasrun: attempt 1 of 1 succeeded" in out


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_hosts_flag_knobs_and_per_rank_logs(tmp_path):
    result = _run(["-np", 2, "-H", "localhost:2", "--output-dir", tmp_path / "logs",
                   "--fusion-threshold-mb", 1, "--cycle-time-ms", 2, "--stall-check-seconds", 45,
                   "--timeline-filename", tmp_path / "timeline.json", "--autotune",
                   sys.executable, SCRIPTS / "print_config.py"], cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    engine = _engine_lines(result.stdout)
    assert sorted(engine) == [0, 1], describe(result)
    for rank, seen in engine.items():
        assert seen["rank"] == rank and seen["size"] == 2
        assert seen["fusion_threshold"] == 1024 * 1024  # fixed by the user: autotune keeps it
        assert seen["cycle_time_ms"] == 2.0
        assert seen["stall_check_seconds"] == 45.0
        assert seen["timeline_path"] == str(tmp_path / "timeline.json")
        assert seen["autotune"] is True and seen["attempt"] == "1"
    assert "[0]<stdout>: SUM 3" in result.stdout and "[1]<stdout>: SUM 3" in result.stdout
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank.{rank}.log").read_text()
        assert f"[{rank}]<stdout>: ENGINE" in log and "ended: exit code 0" in log
    assert "succeeded" in (tmp_path / "logs" / "launcher.log").read_text()
    assert (tmp_path / "timeline.json").exists()


@pytest.mark.timeout(TIMEOUT + 60)
def test_hostfile_and_slot_checks(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# this machine, Horovod's format\nlocalhost slots=2\n")
    result = _run(["-np", 2, "--hostfile", hostfile, sys.executable, SCRIPTS / "whoami.py"])
    assert result.returncode == 0, describe(result)
    assert re.search(r"^\[0\]<stdout>: WHOAMI 0 of 2", result.stdout, re.M), describe(result)
    assert re.search(r"^\[1\]<stdout>: WHOAMI 1 of 2", result.stdout, re.M), describe(result)
    too_many = _run(["-np", 3, "--hostfile", hostfile, sys.executable, SCRIPTS / "whoami.py"])
    assert too_many.returncode == 2 and "np=3 is more than the 2 slots" in too_many.stdout, describe(too_many)


@pytest.mark.slow
@pytest.mark.light  # rank 0 waits to be ended
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("mode, expected", [("exit", "rank 1 on .* exited with code 3"),
                                            ("kill", "rank 1 on .* was killed by signal SIGKILL")])
def test_fail_fast(mode, expected):
    result = _run(["-np", 2, sys.executable, SCRIPTS / "fail_fast.py", mode])
    ended = time.time()
    out = result.stdout
    assert result.returncode == (3 if mode == "exit" else 128 + 9), describe(result)
    failed_at = float(re.search(r"FAILING_AT (\d+\.\d+)", out).group(1))
    assert ended - failed_at < FAIL_FAST_LIMIT_S, describe(result)
    assert re.search(rf"hvdkerasrun: attempt 1 of 1 failed after .*: {expected}", out), describe(result)
    assert re.search(r"all ranks ended \d+\.\d s after it failed", out), describe(result)
    # The report quotes the failing rank's last lines.
    assert re.search(r"hvdkerasrun: last lines of rank 1:\n(\s+\[1\]<std(out|err)>: .*\n)*"
                     r"\s+\[1\]<stdout>: FAILING_AT", out), describe(result)
    assert "[0]<stdout>: rank 0 waiting in allreduce" in out
    assert "UNREACHABLE" not in out


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_max_restarts_resumes_after_a_failure(tmp_path):
    marker = tmp_path / "failed-once"
    logs = tmp_path / "logs"
    result = _run(["-np", 2, "--max-restarts", 2, "--output-dir", logs,
                   sys.executable, SCRIPTS / "fail_once.py", marker], timeout=2 * TIMEOUT)
    assert result.returncode == 0, describe(result)
    out = result.stdout
    assert marker.exists()
    assert "hvdkerasrun: attempt 1 of 3:" in out and "hvdkerasrun: attempt 2 of 3:" in out
    assert re.search(r"attempt 1 of 3 failed after .*: rank 1 on .* exited with code 4", out), describe(result)
    assert "restarting the job in 0.5 s (attempt 2 of 3)" in out
    assert "attempt 2 of 3 succeeded" in out and "attempt 3 of 3" not in out
    assert "[0]<stdout>: COMPLETED attempt 2 sum 2" in out and "[1]<stdout>: COMPLETED attempt 2 sum 2" in out
    launcher_log = (logs / "launcher.log").read_text()
    assert "attempt 1 of 3 failed" in launcher_log and "attempt 2 of 3 succeeded" in launcher_log
    rank1 = (logs / "rank.1.log").read_text()
    assert "=== attempt 1," in rank1 and "=== attempt 1 ended: exit code 4" in rank1
    assert "=== attempt 2," in rank1 and "=== attempt 2 ended: exit code 0" in rank1


def _fake_mpiexec(tmp_path):
    wrapper = tmp_path / "mpiexec"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{SCRIPTS / "fake_mpiexec.py"}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_launcher_of_another_mpi_is_refused(tmp_path):
    result = _run(["-np", 2, sys.executable, SCRIPTS / "whoami.py"],
                  HVDKERAS_MPIEXEC=str(_fake_mpiexec(tmp_path)),
                  FAKE_MPIEXEC_VERSION="mpiexec (Open MPI) 4.1.4")
    assert result.returncode == 2, describe(result)
    assert "belongs to Open MPI, but mpi4py loads MPICH" in result.stdout, describe(result)
    assert "every rank would abort" in result.stdout
    assert "WHOAMI" not in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_worlds_of_size_one_are_caught(tmp_path):
    """A launcher that looks right but gives each rank its own world: init says so."""
    result = _run(["-np", 2, sys.executable, SCRIPTS / "init_only.py"],
                  HVDKERAS_MPIEXEC=str(_fake_mpiexec(tmp_path)))
    assert result.returncode != 0, describe(result)
    assert "world of size 1" in result.stdout and "different MPI" in result.stdout, describe(result)
    assert "SIZE 1" not in result.stdout


@pytest.mark.timeout(TIMEOUT + 60)
def test_the_launcher_ends_the_ranks_when_mpiexec_does_not(tmp_path):
    """The fake launcher never ends the survivors; hvdkerasrun kills the group itself."""
    script = ("import os, sys, time\n"
              "if os.environ['OMPI_COMM_WORLD_RANK'] == '1':\n"
              "    print('rank 1 gives up', flush=True); sys.exit(3)\n"
              "time.sleep(300)\n")
    started = time.time()
    result = _run(["-np", 2, sys.executable, "-c", script], HVDKERAS_MPIEXEC=str(_fake_mpiexec(tmp_path)),
                  HVDKERAS_FAILFAST_GRACE_SECONDS="2")
    took = time.time() - started
    assert result.returncode == 3, describe(result)
    assert "rank 1 on" in result.stdout and "exited with code 3" in result.stdout, describe(result)
    assert "[1]<stdout>: rank 1 gives up" in result.stdout
    assert took < FAIL_FAST_LIMIT_S, describe(result)


@pytest.mark.slow
@pytest.mark.light
@pytest.mark.timeout(TIMEOUT + 60)
def test_check_build_prints_what_hvdkeras_check_prints():
    result = _run(["--check-build"])
    assert result.returncode == 0, describe(result)
    for label in ("hvdkeras:", "TensorFlow:", "MPI vendor:", "MPI thread level:", "op library:"):
        assert label in result.stdout, describe(result)


def test_usage_errors():
    result = _run(["python", "x.py"])
    assert result.returncode == 2 and "-np N is required" in result.stdout
    result = _run(["-np", 2, "--cycle-time-ms", 0, "python", "x.py"])
    assert result.returncode == 2 and "HVDKERAS_CYCLE_TIME" in result.stdout


def test_final_state_of_a_carriage_return_line():
    from hvdkeras.runner.rank_shim import final_state

    assert final_state(b"1/3\r2/3\r3/3\n") == b"3/3\n"
    assert final_state(b"\r a\r b \n") == b" b \n"
    assert final_state(b"plain\n") == b"plain\n"
    assert final_state(b"windows\r\n") == b"windows\n"
    assert final_state(b"no newline\rlast") == b"last"


@pytest.mark.timeout(TIMEOUT + 60)
def test_progress_lines_stay_intact_and_rank_0s_are_live(tmp_path):
    """Carriage-return updates: rank 0's come out live, each after a carriage
    return and its prefix; other ranks' only as their final state; logs hold
    final states."""
    import subprocess

    # Bytes, not text: text mode would turn the carriage returns into newlines.
    command = [str(HVDKERASRUN), "-np", "2", "--output-dir", str(tmp_path / "logs"),
               sys.executable, str(SCRIPTS / "progress.py")]
    result = subprocess.run(command, capture_output=True, timeout=TIMEOUT,
                            env={**os.environ, **_env()}, cwd=REPO, start_new_session=True)
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    # Every carriage return that reaches the terminal is followed by rank 0's prefix.
    assert re.findall(r"\r(?!\[0\]<stdout>: )", out) == [], repr(out)
    assert "\r[0]<stdout>:  step 1/3 " in out and "\r[0]<stdout>:  step 2/3 " in out, repr(out)
    assert re.search(r"\r\[0\]<stdout>:  step 3/3 \n", out), repr(out)
    assert "[1]<stdout>:  step 3/3 \n" in out and "[1]<stdout>:  step 1/3" not in out, repr(out)
    assert "[0]<stdout>: done" in out and "[1]<stdout>: done" in out
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank.{rank}.log").read_text()
        assert f"[{rank}]<stdout>:  step 3/3 \n" in log and "\r" not in log, repr(log)

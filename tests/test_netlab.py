"""Multi-host runs on hosts of their own: the network-namespace lab.

`scripts/netlab.py` makes each host a network namespace on a bridge, with
its own address, hostname, PIDs, System V IPC and /dev/shm (entered through
its ssh stand-in), so MPI between lab hosts goes over TCP as between
machines. The tests launch through `hvdkerasrun` with the options a real
cluster needs (`--ssh-command`, `--launcher-address`, `--network-interfaces`):

* the collective suite (tests/parallel) and the model.fit equivalence on 2
  hosts x 2 ranks and on 3 hosts x 1 rank, with local and cross ranks and
  the engine's allreduce path checked against the real hostnames
  (tests/parallel/test_hosts.py);
* the ring collectives taking every size across 3 and 4 hosts of one rank;
* a host whose link is cut mid-job, at the default stall bound and at 30 s:
  the whole job ends, non-zero, within the liveness bound plus a margin, rank
  0 naming the lost host and its ranks, with no crash and no process left on
  any host; a rank that is only slow is not taken for lost;
* a host that crashes (link down, every process killed) mid-`fit` of a
  recipe run with `--min-np`: the job goes on from the newest checkpoint on
  the host that is left.

They need root and `ip netns` (CI has both); elsewhere they skip, saying why.
By default the suite runs on 2 hosts x 2 ranks with the files whose subject
is the hosts and the allreduce paths (NETLAB_DEFAULT_FILES) and model.fit runs on
3 hosts x 1 rank; HVDKERAS_NETLAB_FULL=1 runs the whole of tests/parallel and
every equivalence case on both layouts.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import json
from pathlib import Path

import pytest

from mpi_runner import RANK_REPORT_DIR, _child_env, _kill_group, assert_every_rank_passed, tail

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(REPO / "scripts"))
import netlab  # noqa: E402

LAB = "hvkt"
NET = 78
HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"
SUITE_TIMEOUT_S = 900
STALL_S = 30
CUT_MARGIN_S = 25  # the watchdog's questions, the abort's spread, the launcher

FULL = os.environ.get("HVDKERAS_NETLAB_FULL") == "1"
# Files of tests/parallel whose subject is where the ranks are and what
# crosses the link: topology, the allreduce paths' exact values, process sets.
NETLAB_DEFAULT_FILES = ("test_hosts.py", "test_allreduce.py", "test_process_sets.py")
SUITE_LAYOUTS = ["2x2", "3x1"] if FULL else ["2x2"]
FIT_LAYOUTS = ["2x2", "3x1"] if FULL else ["3x1"]

WHY_NOT = netlab.can_run()
pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no network lab here: {WHY_NOT}")]


@pytest.fixture(scope="module")
def lab():
    made = netlab.up(LAB, 4, NET, None)
    try:
        yield made
    finally:
        netlab.down(LAB)


def host_options(lab: dict) -> list:
    """The options a real cluster needs, pointed at the lab (hvdkerasrun and
    hvdkeras train take the same ones)."""
    ssh = f"{sys.executable} {REPO / 'scripts' / 'netlab.py'} --name {LAB} ssh"
    return ["--ssh-command", ssh, "--launcher-address", lab["launcher"],
            "--network-interfaces", "eth0"]


def hvdkerasrun_args(lab: dict, hosts: str, np: int) -> list:
    return [str(HVDKERASRUN), "-np", str(np), "-H", hosts, *host_options(lab)]


def lab_hosts(lab: dict, layout: str) -> str:
    """"2x2" -> "h0:2,h1:2" with this lab's host names."""
    count, per = (int(n) for n in layout.split("x"))
    return ",".join(f"{h['host']}:{per}" for h in lab["hosts"][:count])


def run_launcher(args: list, timeout: float, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", env=_child_env(env), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out = proc.communicate(timeout=10)[0]
        raise AssertionError(f"timed out after {timeout} s:\n{tail(out)}") from None
    return subprocess.CompletedProcess(args, proc.returncode, out, None)


def run_pytest_on_lab(lab: dict, layout: str, targets: list, extra=(), env=None) -> None:
    count, per = (int(n) for n in layout.split("x"))
    np = count * per
    hosts = lab_hosts(lab, layout)
    with tempfile.TemporaryDirectory(prefix="hvdkeras-lab-") as reports:
        result = run_launcher(
            [*hvdkerasrun_args(lab, hosts, np), sys.executable, "-m", "pytest", "-x", "-q",
             "-p", "no:cacheprovider", *extra, *[str(t) for t in targets]],
            timeout=SUITE_TIMEOUT_S,
            env={"HVDKERAS_UNDER_MPI": "1", RANK_REPORT_DIR: reports,
                 "HVDKERAS_TEST_HOSTS": hosts, "HVDKERAS_TEST_REAL_HOSTS": "1",
                 "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_S), **(env or {})})
        found = sorted(Path(reports).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        records = [json.loads(p.read_text()) for p in found]
    assert_every_rank_passed(np, result, records)
    assert not netlab.leftovers(LAB), netlab.leftovers(LAB)


@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
@pytest.mark.parametrize("layout", SUITE_LAYOUTS)
def test_collective_suite_on_lab_hosts(lab, layout):
    files = [TESTS / "parallel"] if FULL else [
        TESTS / "parallel" / name for name in NETLAB_DEFAULT_FILES]
    assert all(f.exists() for f in files), files
    # Each large product of cases pairwise (Note [pairwise cases] in
    # tests/parallel/conftest.py); every case with FULL.
    run_pytest_on_lab(lab, layout, files, env={"HVDKERAS_PAIRWISE_CASES": "0" if FULL else "1"})


@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
@pytest.mark.parametrize("layout", FIT_LAYOUTS)
def test_fit_matches_one_process_on_lab_hosts(lab, layout):
    run_pytest_on_lab(lab, layout, [TESTS / "keras_parallel" / "test_equivalence.py"],
                      extra=["-W", "ignore::DeprecationWarning",
                             *([] if FULL else ["-k", "global_batch or buckets"])])


@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
def test_cross_step_updates_match_the_synchronous_step_on_lab_hosts(lab):
    """Across hosts of their own, where `auto` turns cross-step updates on
    (Note [cross-step updates] in hvdkeras/training/cross_step.py): 20 steps
    of SGD with momentum, Adam and AdamW, in float32 and mixed_bfloat16,
    give the synchronous step's weights exactly, the buckets reordered on
    the wire (Note [priority on the wire] in ops/core/wire_order.h)."""
    run_pytest_on_lab(lab, "2x1", [TESTS / "keras_parallel" / "test_cross_step.py"],
                      extra=["-W", "ignore::DeprecationWarning", "-k",
                             "bit_for_bit and (sgd_momentum or adam) or mixed_bfloat16 "
                             "or prioritised"])


# The ring across hosts of their own (Note [ring across hosts] in
# ops/core/ring_plan.h), at 3 and 4 hosts of one rank: with its threshold at
# 0 it takes every allreduce, reduce-scatter and allgather of these files
# (every dtype and op, odd sizes, fused buffers, process sets) over TCP.
RING_FILES = ("test_allreduce.py", "test_gather_scatter.py", "test_process_sets.py")


@pytest.mark.timeout(SUITE_TIMEOUT_S + 120)
@pytest.mark.parametrize("layout", ["3x1", "4x1"])
def test_ring_collectives_across_lab_hosts(lab, layout):
    # Every case at 3 hosts; at 4 each large product pairwise (every two
    # parameters' values still meet on the ring: Note [pairwise cases] in
    # tests/parallel/conftest.py), every case with FULL.
    pairwise = "1" if layout == "4x1" and not FULL else "0"
    run_pytest_on_lab(lab, layout, [TESTS / "parallel" / name for name in RING_FILES],
                      env={"HVDKERAS_RING_MIN_BYTES": "0", "HVDKERAS_PAIRWISE_CASES": pairwise})


CUT_JOB = """
import sys, time
import tensorflow as tf
import hvdkeras as hvd
hvd.init()
x = tf.ones([1 << 16])
for step in range(5):
    hvd.allreduce(x, name=f"warm.{step}")
print(f"READY {hvd.rank()}", flush=True)
for step in range(10 ** 6):
    hvd.allreduce(x, name=f"loop.{step % 4}")
    time.sleep(0.01)
print("UNREACHABLE", flush=True)
"""


LIVENESS_S = 60  # the default (HVDKERAS_LIVENESS_SECONDS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stall", [None, 30], ids=["default-bound", "stall-30s"])
def test_a_cut_link_ends_the_whole_job(lab, tmp_path, capsys, stall):
    """Host h1's link is cut while every rank loops on allreduces: at the
    default stall bound (30 minutes) and at 30 s, liveness ends the job
    within its bound (60 s, or half the stall bound) plus a margin, rank 0
    naming the lost host and its ranks, with no crash on the surviving host
    (an MPI send to a rank behind a cut link crashes inside MPI; Note [host
    liveness] in ops/core/liveness.h) and nothing left on any host."""
    script = tmp_path / "cut_job.py"
    script.write_text(CUT_JOB)
    hosts = lab_hosts(lab, "2x2")
    lost = lab["hosts"][1]["host"]
    bound = LIVENESS_S if stall is None else min(LIVENESS_S, stall / 2)
    stall_args = [] if stall is None else ["--stall-shutdown-seconds", stall]
    proc = subprocess.Popen(
        [str(a) for a in [*hvdkerasrun_args(lab, hosts, 4), *stall_args, sys.executable,
                          script]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        errors="replace", env=_child_env({}), start_new_session=True)
    lines: list = []
    ready = set()

    def read():
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"READY (\d)", line)
            if match:
                ready.add(match.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while len(ready) < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(ready) == 4, "".join(lines[-40:])
    time.sleep(1.0)
    netlab.link(LAB, lost, "down")
    cut_at = time.monotonic()
    try:
        proc.wait(timeout=bound + CUT_MARGIN_S + 60)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise AssertionError("the job did not end after the cut:\n" + "".join(lines[-60:]))
    finally:
        netlab.link(LAB, lost, "up")
    took = time.monotonic() - cut_at
    reader.join(timeout=10)
    output = "".join(lines)
    assert proc.returncode != 0, output
    assert took < bound + CUT_MARGIN_S, f"ended {took:.1f} s after the cut\n{output[-6000:]}"
    # Rank 0 names the host whose link was cut, and its ranks; nobody crashed.
    assert re.search(rf"rank 0 on \S+ failed with lost host\(s\) {lost}: nothing from "
                     r"rank\(s\) 2, 3", output), output[-6000:]
    assert "SIGSEGV" not in output and "killed by signal" not in output, output[-6000:]
    assert "UNREACHABLE" not in output
    with capsys.disabled():
        print(f"\ncut link: the job ended {took:.1f} s after the cut (liveness bound {bound} s, "
              f"stall bound {stall or 'default'}), exit code {proc.returncode}")
    deadline = time.monotonic() + 30
    while netlab.leftovers(LAB) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not netlab.leftovers(LAB), f"left on the hosts: {netlab.leftovers(LAB)}"


SLOW_JOB = """
import time
import numpy as np
import tensorflow as tf
import hvdkeras as hvd
hvd.init()
for step in range(3):
    if hvd.rank() == 1 and step == 1:
        time.sleep(float({pause}))  # only slow: far longer than the liveness bound
    total = hvd.allreduce(tf.fill([1000], float(hvd.rank() + 1)), op=hvd.Sum, name=f"s{{step}}")
    assert np.all(total.numpy() == 3.0), total.numpy()[:4]
print(f"DONE {{hvd.rank()}}", flush=True)
"""


@pytest.mark.timeout(300)
def test_a_slow_rank_on_another_host_is_not_taken_for_lost(lab, tmp_path):
    """A rank on h1 that sleeps four liveness bounds between two collectives
    (its watchdog thread keeps beating) leaves the job running to the end at
    the default stall bound."""
    script = tmp_path / "slow_job.py"
    script.write_text(SLOW_JOB.format(pause=20))
    result = run_launcher([*hvdkerasrun_args(lab, lab_hosts(lab, "2x1"), 2),
                           "--liveness-seconds", 5, sys.executable, script], timeout=240,
                          env={})
    assert result.returncode == 0, result.stdout[-6000:]
    assert "DONE 0" in result.stdout and "DONE 1" in result.stdout, result.stdout[-6000:]
    assert "lost host" not in result.stdout


CRASH_STALL_S = 10
CRASH_RECIPE = """\
version: 1
seed: 5
model: {{name: "resume_model:build", args: {{dropout: 0.1, hidden: [64]}}}}
data: {{source: bundled, layout: flat, batch_size: 16, validation: {{split: 0.2}}}}
optimizer: {{name: adam, learning_rate: 2e-3}}
training: {{epochs: 4, verbose: 0}}
checkpoint: {{dir: {directory}, every_steps: 10, keep: 3}}
"""


@pytest.mark.timeout(900)
def test_a_crashed_host_leaves_the_job_on_the_other(lab, tmp_path, capsys):
    """Host h1 (ranks 2 and 3) loses power at step 30 of a 4-rank recipe run
    with --min-np 2: the job ends within the bound, names h1's ranks as the
    silent ones, relaunches on h0's 2 slots and resumes from the newest
    checkpoint written before the crash."""
    ck = tmp_path / "ck"
    recipe = tmp_path / "crash.yaml"
    recipe.write_text(CRASH_RECIPE.format(directory=ck))
    summary = tmp_path / "summary.json"
    lost = lab["hosts"][1]["host"]
    bin_dir = Path(sys.executable).parent
    args = [bin_dir / "hvdkeras", "train", recipe, "--np", 4, "--min-np", 2,
            "--hosts", lab_hosts(lab, "2x2"), "--summary-json", summary,
            *host_options(lab)]
    env = _child_env({
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS / "scripts"),
                                                    os.environ.get("PYTHONPATH")])),
        "HVDKERAS_RESTART_BACKOFF_SECONDS": "0.2", "RESUME_TEST_HOLD": "2:30",
        "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(CRASH_STALL_S)})
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            errors="replace", env=env, start_new_session=True, cwd=tmp_path)
    lines: list = []
    events: dict = {}

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "HOLDING rank at step 30" in line and "hold" not in events:
                events["hold"] = time.monotonic()
                events["killed"] = netlab.crash(LAB, lost)
            if "attempt 1 of" in line and "failed after" in line and "ended" not in events:
                events["ended"] = time.monotonic()
                events["newest"] = sorted(p.name for p in ck.iterdir()) if ck.exists() else []

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=800)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise AssertionError("the job did not end:\n" + "".join(lines[-80:]))
    finally:
        netlab.link(LAB, lost, "up")
    reader.join(timeout=10)
    out = "".join(lines)
    assert proc.returncode == 0, out[-8000:]
    assert "hold" in events and events["killed"] > 0, out[-8000:]
    took = events["ended"] - events["hold"]
    assert took < CRASH_STALL_S + CUT_MARGIN_S, f"attempt 1 ended {took:.1f} s after the crash"
    assert re.search(r"lost host\(s\) \S+: nothing from rank\(s\) 2, 3", out), out[-8000:]
    assert (f"resizing the job from 4 to 2 rank(s) on {lab['hosts'][0]['host']}:2" in out), \
        out[-8000:]
    resumed = re.search(r"hvdkeras: resumed from (\S+): continuing at epoch[^\n]*", out)
    assert resumed, out[-8000:]
    # The newest checkpoint when attempt 1 ended is the one attempt 2 took.
    assert Path(resumed.group(1)).name in events["newest"][-1:] or \
        Path(resumed.group(1)).parent.name in events["newest"][-1:], (resumed.group(1),
                                                                      events["newest"])
    final = json.loads(summary.read_text())
    assert final["ranks"] == 2 and final["last_epoch"] == 4, final
    with capsys.disabled():
        print(f"\ncrashed host: attempt 1 ended {took:.1f} s after the crash (bound "
              f"{CRASH_STALL_S} s, {events['killed']} process(es) killed); attempt 2 "
              f"{resumed.group(0)[len('hvdkeras: '):]}")
    deadline = time.monotonic() + 30
    while netlab.leftovers(LAB) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not netlab.leftovers(LAB), f"left on the hosts: {netlab.leftovers(LAB)}"

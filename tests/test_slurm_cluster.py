"""hvdkeras on a real Slurm cluster: Debian's Slurm 22.05 on the network lab's hosts.

`scripts/slurmlab.py` starts munged, slurmctld on the first host and one
slurmd per host, each host a network namespace with its own address,
hostname, PIDs and /dev/shm, and no ssh server: work reaches the nodes only
through Slurm. From this machine the tests submit jobs as users do:

* `sbatch -N 3` of `hvdkerasrun python check.py` with no host list (read from
  the allocation, the ranks started through srun), exact sums from ranks on
  three different hosts; `sbatch -N 2` of `hvdkeras train recipe.yaml`, whose
  output file holds rank 0's progress once;
* `srun --mpi=pmi2` starting the ranks itself, and with `-K` a rank that
  fails at start-up ending the whole step at once;
* a node's link cut mid-job, and a node's slurmd killed (in the lab that
  ends every process on the host): the job ends, naming the node, and
  nothing is left on any node or in the queue;
* `scancel` mid-epoch (every rank ends, the newest checkpoint loads) and a
  requeued job resuming from its checkpoint.

They need root, `ip netns` and the slurm-wlm and munge packages
(`bash scripts/setup_env.sh` installs them as root); elsewhere they skip,
saying why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(REPO / "scripts"))
import netlab  # noqa: E402
import slurmlab  # noqa: E402

NAME = "hvks"
NET = 82
BIN = Path(sys.executable).parent
WHY_NOT = slurmlab.can_run()
pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no Slurm cluster here: {WHY_NOT}")]

CHECK = """
import socket
import numpy as np
import tensorflow as tf
import hvdkeras as hvd
hvd.init()
total = hvd.allreduce(tf.fill([4], float(hvd.rank() + 1)), op=hvd.Sum, name="check")
expected = hvd.size() * (hvd.size() + 1) / 2
assert np.all(total.numpy() == expected), total.numpy()
print(f"CHECK rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()} sum {total.numpy()[0]:g}",
      flush=True)
"""


@pytest.fixture(scope="module")
def cluster():
    state = slurmlab.up(NAME, 3, NET)
    try:
        yield state
    finally:
        slurmlab.down(NAME)


def slurm_env() -> dict:
    return {**os.environ, "SLURM_CONF": str(slurmlab.conf_path(NAME)),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def slurm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=slurm_env(), stdin=subprocess.DEVNULL)


def submit(tmp_path: Path, body: str, *options: str) -> tuple[str, Path]:
    """Submits a batch script; (job id, its output file)."""
    script = tmp_path / f"job{len(list(tmp_path.glob('job*.sh')))}.sh"
    output = script.with_suffix(".out")
    script.write_text(f"#!/bin/bash\n#SBATCH --output={output}\n#SBATCH --open-mode=append\n"
                      f"cd {tmp_path}\n{body}\n")
    result = slurm("sbatch", "--parsable", *options, script)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0], output


def job_state(job: str) -> str:
    out = slurm("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
    return out or "GONE"


def wait_gone(job: str, timeout: float) -> float:
    """Seconds until the job leaves the queue (fails after `timeout`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if job_state(job) == "GONE":
            return time.monotonic() - start
        time.sleep(1.0)
    raise AssertionError(f"job {job} still {job_state(job)} after {timeout} s")


def wait_for(path: Path, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        match = re.search(pattern, text)
        if match:
            return match
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout} s:\n"
                         f"{path.read_text()[-4000:] if path.exists() else '(no file)'}")


def assert_nothing_left(cluster: dict) -> None:
    """Only the Slurm daemons (and their stand-in shells) run on the hosts."""
    deadline = time.monotonic() + 30
    while True:
        found = []
        for pid in netlab.leftovers(NAME):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if not re.search(r"slurmctld|slurmscriptd|slurmd|^sh -c|unshare|netlab", command):
                found.append(f"{pid}: {command[:120]}")
        if not found or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert not found, "left on the nodes:\n" + "\n".join(found)


@pytest.mark.timeout(300)
def test_sbatch_runs_hvdkerasrun_on_the_allocation(cluster, tmp_path):
    (tmp_path / "check.py").write_text(CHECK)
    job, output = submit(tmp_path, f"hvdkerasrun {sys.executable} check.py", "-N", "3",
                         "--ntasks-per-node=1")
    wait_gone(job, 240)
    text = output.read_text()
    hosts = [h["host"] for h in cluster["lab"]["hosts"]]
    assert f"hosts from the Slurm allocation: {hosts[0]}:1,{hosts[1]}:1,{hosts[2]}:1 " \
           "(started through srun)" in text, text
    ranks = re.findall(r"CHECK rank (\d) of 3 on (\S+) sum 6\b", text)
    assert sorted(ranks) == [("0", hosts[0]), ("1", hosts[1]), ("2", hosts[2])], text
    assert "succeeded" in text, text
    assert_nothing_left(cluster)


@pytest.mark.timeout(300)
def test_sbatch_trains_a_recipe_with_rank_0_printing(cluster, tmp_path):
    job, output = submit(
        tmp_path, f"hvdkeras train {REPO / 'recipes' / 'tabular_mlp.yaml'} "
        "--set training.epochs=2 --set training.steps_per_epoch=4 --set data.batch_size=16",
        "-N", "2", "--ntasks-per-node=1")
    wait_gone(job, 240)
    text = output.read_text()
    assert "2 rank(s)" in text and "succeeded" in text, text
    # Progress comes from rank 0 alone: each epoch once.
    assert text.count("Epoch 1/2") == 1 and text.count("Epoch 2/2") == 1, text
    assert not re.search(r"^\[1\]<stdout>: Epoch", text, re.M), text
    assert "finished in" in text and "on 2 ranks" in text, text


@pytest.mark.timeout(300)
def test_srun_starts_the_ranks_itself(cluster, tmp_path):
    (tmp_path / "check.py").write_text(CHECK)
    result = slurm("srun", "-K", "-N", "3", "-n", "6", "--mpi=pmi2", sys.executable,
                   tmp_path / "check.py", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = re.findall(r"CHECK rank (\d) of 6 on (\S+) sum 21\b", result.stdout)
    assert len(ranks) == 6, result.stdout
    assert len({host for _, host in ranks}) == 3, ranks


FAIL_AT_START = """
import os, sys
if os.environ.get("SLURM_PROCID") == "1":
    sys.exit("rank 1 fails at start-up")
import hvdkeras as hvd
hvd.init()
print("UNREACHABLE", flush=True)
"""


@pytest.mark.timeout(300)
def test_srun_ends_the_step_when_a_rank_fails_at_start_up(cluster, tmp_path):
    (tmp_path / "fail.py").write_text(FAIL_AT_START)
    start = time.monotonic()
    # Each task's stderr goes to a file its node's slurmstepd writes: srun's
    # own relay of a task's last lines can lose the race with -K's teardown,
    # which then reports the task's exit without its message.
    result = slurm("srun", "-K", "-N", "2", "-n", "2", "--mpi=pmi2",
                   f"--error={tmp_path}/err-%t.txt", f"--output={tmp_path}/out-%t.txt",
                   sys.executable, tmp_path / "fail.py", timeout=120)
    took = time.monotonic() - start
    assert result.returncode != 0
    assert "task 1: Exited with exit code 1" in result.stderr, result.stderr[-3000:]
    failed = (tmp_path / "err-1.txt").read_text()
    assert "rank 1 fails at start-up" in failed, failed
    outputs = [path.read_text() for path in tmp_path.glob("out-*.txt")]
    assert not any("UNREACHABLE" in text for text in outputs + [result.stdout]), outputs
    assert took < 60, took
    assert_nothing_left(cluster)


CUT_JOB = """
import time
import tensorflow as tf
import hvdkeras as hvd
hvd.init()
x = tf.ones([1 << 14])
for step in range(10 ** 6):
    hvd.allreduce(x, name=f"loop.{step % 4}")
    if step == 5:
        print(f"READY {hvd.rank()}", flush=True)
    time.sleep(0.01)
"""


@pytest.mark.timeout(400)
def test_a_node_cut_off_mid_job_ends_it_naming_the_node(cluster, tmp_path):
    (tmp_path / "cut.py").write_text(CUT_JOB)
    lost = cluster["lab"]["hosts"][2]["host"]
    job, output = submit(tmp_path, f"hvdkerasrun --liveness-seconds 10 {sys.executable} cut.py",
                         "-N", "3", "--ntasks-per-node=1")
    for rank in range(3):
        wait_for(output, rf"READY {rank}", 240)
    netlab.link(NAME, lost, "down")
    try:
        took = wait_gone(job, 180)
    finally:
        netlab.link(NAME, lost, "up")
    text = output.read_text()
    assert re.search(rf"lost host\(s\) {lost}: nothing from rank\(s\) 2", text), text[-4000:]
    assert "SIGSEGV" not in text, text[-4000:]
    print(f"\ncut node: the job left the queue {took:.1f} s after the cut")
    assert_nothing_left(cluster)
    # The node is back for the next tests. Slurm marked it down while it
    # did not answer and, with the link back, would return it to service
    # only after minutes (more than 120 s here); an administrator resumes it.
    resumed = slurm("scontrol", "update", f"NodeName={lost}", "State=RESUME")
    assert resumed.returncode == 0, resumed.stderr
    deadline = time.monotonic() + 120
    while slurmlab.nodes_idle(NAME).get(lost) != "idle" and time.monotonic() < deadline:
        time.sleep(2)


@pytest.mark.timeout(400)
def test_a_killed_slurmd_ends_the_job_naming_its_node(cluster, tmp_path):
    """In the lab slurmd is its host's first process, so killing it ends every
    process on the host at once (a node crash with the link still up): the
    rank there leaves no record, and the launcher names it and its node."""
    (tmp_path / "cut.py").write_text(CUT_JOB)
    lost = cluster["lab"]["hosts"][2]["host"]
    job, output = submit(tmp_path, f"hvdkerasrun {sys.executable} cut.py", "-N", "3",
                         "--ntasks-per-node=1")
    for rank in range(3):
        wait_for(output, rf"READY {rank}", 240)
    daemon = subprocess.run(["pgrep", "-f", f"^slurmd -D -N {lost} "], capture_output=True,
                            text=True).stdout.split()
    assert len(daemon) == 1, daemon
    os.kill(int(daemon[0]), signal.SIGKILL)
    try:
        took = wait_gone(job, 180)
        text = output.read_text()
        assert re.search(rf"rank\(s\) 2 on {lost} vanished without a trace", text), text[-4000:]
        print(f"\nkilled slurmd: the job left the queue {took:.1f} s after the kill")
        assert_nothing_left(cluster)
    finally:
        slurmlab.restart_slurmd(NAME, lost)
    deadline = time.monotonic() + 120
    while slurmlab.nodes_idle(NAME).get(lost) != "idle" and time.monotonic() < deadline:
        time.sleep(2)


RECIPE = """\
version: 1
seed: 5
model: {{name: "resume_model:build", args: {{dropout: 0.1, hidden: [64]}}}}
data: {{source: bundled, layout: flat, batch_size: 16, validation: {{split: 0.2}}}}
optimizer: {{name: adam, learning_rate: 2e-3}}
training: {{epochs: {epochs}, verbose: 2}}
checkpoint: {{dir: {directory}, every_steps: 10, keep: 3}}
"""


def recipe_job(tmp_path: Path, epochs: int, hold: str = "") -> str:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.format(epochs=epochs, directory=tmp_path / "ck"))
    hold_env = f"RESUME_TEST_HOLD={hold} " if hold else ""
    return (f"export PYTHONPATH={TESTS / 'scripts'}\n"
            f"{hold_env}hvdkeras train {recipe} --summary-json {tmp_path / 'summary.json'}")


@pytest.mark.timeout(400)
def test_scancel_mid_epoch_ends_every_rank_and_keeps_the_checkpoint(cluster, tmp_path):
    job, output = submit(tmp_path, recipe_job(tmp_path, 4, hold="1:25"), "-N", "2",
                         "--ntasks-per-node=1")
    wait_for(output, r"HOLDING rank at step 25", 240)
    newest = sorted((tmp_path / "ck").iterdir())
    assert newest, "no checkpoint before the cancel"
    result = slurm("scancel", job)
    assert result.returncode == 0, result.stderr
    took = wait_gone(job, 120)
    print(f"\nscancel: the job left the queue {took:.1f} s after scancel")
    assert_nothing_left(cluster)
    # Every checkpoint is whole (written atomically): a readable archive.
    files = sorted(p for p in (tmp_path / "ck").rglob("*.keras"))
    assert files and not list((tmp_path / "ck").rglob("*.tmp*")), list((tmp_path / "ck").rglob("*"))
    for path in files:
        with zipfile.ZipFile(path) as archive:
            assert archive.testzip() is None, path


@pytest.mark.timeout(500)
def test_a_requeued_job_resumes_from_its_checkpoint(cluster, tmp_path):
    job, output = submit(tmp_path, recipe_job(tmp_path, 3), "-N", "2", "--ntasks-per-node=1",
                         "--requeue")
    wait_for(output, r"Epoch 2/3", 240)
    result = slurm("scontrol", "requeue", job)
    assert result.returncode == 0, result.stderr
    wait_for(output, r"resumed from \S+", 300)
    wait_gone(job, 300)
    text = output.read_text()
    assert text.count("succeeded") == 1, text[-4000:]
    assert '"epochs_run"' in (tmp_path / "summary.json").read_text()

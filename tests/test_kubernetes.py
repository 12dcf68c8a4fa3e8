"""The Kubernetes path (deploy/kubernetes): an MPIJob for the Kubeflow MPI
Operator and the image it runs. No cluster or container runtime exists here,
so this checks what can be checked without one: the manifest is a consistent
MPIJob, the image compiles the op library at build time, the host list the
operator writes is what hvdkerasrun reads, and the launcher's own command
trains (on this machine's 2 ranks, from a host file in the operator's format,
one epoch)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from hvdkeras.recipes import bundled_recipes
from hvdkeras.runner.hosts import HostSlots, parse_hostfile_text
from mpi_runner import describe, run_command

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
HVDKERAS = Path(sys.executable).parent / "hvdkeras"
TIMEOUT = 300


@pytest.fixture(scope="module")
def job():
    return yaml.safe_load((DEPLOY / "mpijob-digits.yaml").read_text())


def _launcher_command(job):
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    return container["command"]


def test_manifest_is_an_mpich_mpijob(job):
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    assert job["spec"]["mpiImplementation"] == "MPICH"
    specs = job["spec"]["mpiReplicaSpecs"]
    assert specs["Launcher"]["replicas"] == 1
    images = {c["image"] for role in specs.values() for c in role["template"]["spec"]["containers"]}
    assert len(images) == 1, images  # launcher and workers run the same image
    (worker,) = specs["Worker"]["template"]["spec"]["containers"]
    assert worker["command"][0] == "/usr/sbin/sshd"  # the launcher reaches workers over ssh


def test_launcher_runs_every_slot_from_the_operators_host_file(job):
    command = _launcher_command(job)
    assert command[:2] == ["hvdkeras", "train"] and command[2] in bundled_recipes()
    np_ = int(command[command.index("--np") + 1])
    slots = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] * job["spec"]["slotsPerWorker"]
    assert np_ == slots
    assert command[command.index("--hostfile") + 1] == "/etc/mpi/hostfile"


def test_the_operators_mpich_host_file_is_read():
    # What the operator writes for MPICH: "<pod>.<service>.<namespace>.svc:<slots>" per worker.
    text = ("hvdkeras-digits-worker-0.hvdkeras-digits.default.svc:2\n"
            "hvdkeras-digits-worker-1.hvdkeras-digits.default.svc:2\n")
    assert parse_hostfile_text(text) == [
        HostSlots("hvdkeras-digits-worker-0.hvdkeras-digits.default.svc", 2),
        HostSlots("hvdkeras-digits-worker-1.hvdkeras-digits.default.svc", 2)]


def test_image_compiles_the_op_library_at_build_time():
    text = (DEPLOY / "Dockerfile").read_text()
    build = text.index("hvdkeras build")
    assert text.index("pip install") < build
    assert "HVDKERAS_CACHE_DIR=" in text and text.index("HVDKERAS_CACHE_DIR=") < build
    assert "openssh-server" in text and "g++" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


@pytest.mark.slow
@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(TIMEOUT + 60)
def test_launcher_command_trains_from_a_host_file_in_the_operators_format(job, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost:2\n")  # this machine, as the operator would list a worker
    command = list(_launcher_command(job))
    command[0] = str(HVDKERAS)
    command[command.index("--np") + 1] = "2"
    command[command.index("--hostfile") + 1] = str(hostfile)
    result = run_command([*command, "--set", "training.epochs=1"], timeout=TIMEOUT, cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    assert "finished in" in result.stdout, describe(result)
    assert (tmp_path / "runs" / "digits" / "history.csv").exists()

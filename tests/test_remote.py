"""How hvdkerasrun reaches other hosts (hvdkeras/runner/remote.py): pure
option building, and the reachability check with a stand-in ssh command (a
script that answers for some host names and not others; the real thing runs
on the network-namespace lab in tests/test_netlab.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkeras.runner import mpi_env, remote
from hvdkeras.runner.remote import RemoteAccess

HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"


def test_ssh_words_and_the_launcher_script():
    access = RemoteAccess(ssh_command="ssh -o Foo=1", ssh_port=2222, identity_file="/k ey")
    assert remote.ssh_words(access) == ["ssh", "-o", "Foo=1", "-p", "2222", "-i", "/k ey"]
    assert remote.launcher_script(access) == (
        "#!/bin/sh\nexec ssh -o Foo=1 -p 2222 -i '/k ey' \"$@\"\n")
    with pytest.raises(ValueError, match="--ssh-port must be a port number"):
        remote.ssh_words(RemoteAccess(ssh_port=70000))
    with pytest.raises(ValueError, match="--ssh-command is empty"):
        remote.ssh_words(RemoteAccess(ssh_command=" "))


def test_hydra_and_open_mpi_options():
    access = RemoteAccess(network_interfaces=("eth0", "eth1"), launcher_address="10.0.0.9")
    assert remote.mpiexec_args(access, mpi_env.MPICH, "/tmp/x", remote_hosts=True) == [
        "-launcher", "ssh", "-launcher-exec", "/tmp/x", "-localhost", "10.0.0.9"]
    # Without an address, the hosts call back on the launcher's interface of
    # that name (Hydra would let -iface win over -localhost).
    assert remote.mpiexec_args(RemoteAccess(network_interfaces=("eth0",)), mpi_env.MPICH,
                               None, remote_hosts=True) == ["-iface", "eth0"]
    assert remote.mpiexec_args(RemoteAccess(), mpi_env.MPICH, None, remote_hosts=False) == []
    ompi = remote.mpiexec_args(RemoteAccess(ssh_port=22, network_interfaces=("ib0",)),
                               mpi_env.OPENMPI, None, remote_hosts=True)
    assert ompi == ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", "-p 22",
                    "--mca", "btl_tcp_if_include", "ib0", "--mca", "oob_tcp_if_include", "ib0"]
    assert remote.rank_env(access)["UCX_NET_DEVICES"] == "eth0,eth1"
    assert remote.rank_env(RemoteAccess()) == {}


def test_which_hosts_are_remote_and_who_launches():
    assert remote.remote_hosts(["localhost", "a", "me", "a", "127.0.0.1", "b"], ["me"]) == [
        "a", "b"]
    assert remote.picks_own_launcher(["-launcher", "fork"])
    assert remote.picks_own_launcher(["--mca", "plm_rsh_agent", "x"])
    assert not remote.picks_own_launcher(["-genv", "A", "1"])


@pytest.fixture
def fake_ssh(tmp_path: Path) -> Path:
    """An ssh stand-in: hosts named good* answer, others fail like ssh does."""
    script = tmp_path / "fake-ssh"
    script.write_text("#!/bin/sh\n"
                      "while [ $# -gt 0 ]; do case $1 in -p|-i|-o) shift 2;; -*) shift;; "
                      "*) break;; esac; done\n"
                      'case $1 in good*) exit 0;; *) echo "ssh: connect to host $1 port 22: '
                      'No route to host" >&2; exit 255;; esac\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_check_reachable_names_the_hosts_that_do_not_answer(fake_ssh: Path):
    access = RemoteAccess(ssh_command=str(fake_ssh), ssh_port=2200)
    failures = remote.check_reachable(access, ["good1", "bad1", "good2", "bad2"])
    assert set(failures) == {"bad1", "bad2"}
    assert "No route to host" in failures["bad1"]
    message = remote.unreachable_message(failures, access)
    assert message.startswith(f"hvdkerasrun: 2 host(s) could not be reached with `{fake_ssh} -p "
                              "2200 HOST true`, so nothing was started: bad1: ")


def test_hvdkerasrun_starts_nothing_when_a_host_does_not_answer(fake_ssh: Path, tmp_path: Path):
    marker = tmp_path / "started"
    result = subprocess.run(
        [str(HVDKERASRUN), "-np", "2", "-H", "good1:1,bad1:1", "--ssh-command", str(fake_ssh),
         sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"],
        capture_output=True, text=True, timeout=120, env={**os.environ})
    assert result.returncode == 2, result.stderr
    assert "1 host(s) could not be reached" in result.stderr and "bad1: ssh: connect to host " \
        "bad1 port 22: No route to host" in result.stderr, result.stderr
    assert not marker.exists()


def test_a_recipe_run_checks_the_hosts_the_same_way(fake_ssh: Path, tmp_path: Path):
    # `hvdkeras train` takes hvdkerasrun's host options (one definition,
    # hvdkeras/runner/remote_options.py) and refuses before any rank starts.
    result = subprocess.run(
        [sys.executable, "-m", "hvdkeras.cli", "train", "digits", "--np", "2",
         "--hosts", "good1:1,bad2:1", "--ssh-command", str(fake_ssh), "--ssh-port", "2200"],
        capture_output=True, text=True, timeout=300, env={**os.environ}, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"could not be reached with `{fake_ssh} -p 2200 HOST true`" in result.stderr
    assert "bad2: ssh: connect to host bad2" in result.stderr, result.stderr
    assert not (tmp_path / "runs").exists()

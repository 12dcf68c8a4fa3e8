"""Unit tests of the launcher's pure logic and of its building blocks that need no MPI.

Host lists and hostfiles, knob -> environment mapping, launcher/library vendor
matching, mpiexec command assembly, restart policy, failure reports, the
Spark connect plan, the per-rank shim (run directly, without mpiexec) and the
HMAC-authenticated service.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from hvdkeras.runner import failures, hosts, knobs, launch as launch_mod, mpi_env, rank_shim, restart, service
from hvdkeras.runner.hosts import HostSlots
from hvdkeras.cluster.connect import chain_steps

# ---------------------------------------------------------------------------
# hosts
# ---------------------------------------------------------------------------


def test_parse_hosts_slots_default_and_merge():
    assert hosts.parse_hosts("a:2,b,c:3,a:1") == [
        HostSlots("a", 3), HostSlots("b", 1), HostSlots("c", 3)]
    assert hosts.parse_hosts("[::1]:2,10.0.0.5:4") == [HostSlots("[::1]", 2), HostSlots("10.0.0.5", 4)]


@pytest.mark.parametrize("spec, words", [
    ("", "host:slots"), ("a,,b", "host:slots"), ("a:0", "at least 1 slot"),
    ("a:two", "whole number"), ("fe80::1:2", "brackets"), ("a b:1", "not a host"),
])
def test_parse_hosts_errors(spec, words):
    with pytest.raises(ValueError, match=words):
        hosts.parse_hosts(spec)


def test_parse_hostfile_formats(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\nnode2:2   # comment\n\nnode3 max_slots=8 slots=1\nnode4\n")
    assert hosts.parse_hostfile(str(path)) == [
        HostSlots("node1", 4), HostSlots("node2", 2), HostSlots("node3", 1), HostSlots("node4", 1)]


@pytest.mark.parametrize("text, words", [
    ("node1 slots=x\n", "whole number"), ("node1 cores=2\n", "unknown setting"),
    ("node1 4\n", "key=value"), ("# nothing\n\n", "no hosts"),
])
def test_parse_hostfile_errors(text, words):
    with pytest.raises(ValueError, match=words):
        hosts.parse_hostfile_text(text)


def test_unreadable_hostfile_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read hostfile"):
        hosts.parse_hostfile(str(tmp_path / "missing"))


def test_vendor_file_formats():
    entries = [HostSlots("a", 2), HostSlots("b", 1)]
    assert hosts.hosts_argument(entries) == "a:2,b:1"
    assert hosts.hydra_machinefile(entries) == "a:2\nb:1\n"
    assert hosts.openmpi_hostfile(entries) == "a slots=2\nb slots=1\n"
    assert hosts.is_local_only([HostSlots("localhost", 2)])
    assert not hosts.is_local_only(entries)


# ---------------------------------------------------------------------------
# knobs
# ---------------------------------------------------------------------------


def test_knob_env_maps_every_flag(tmp_path):
    env = knobs.knob_env(knobs.Knobs(
        fusion_threshold_mb=1.5, cycle_time_ms=3.5, cache_capacity=0, timeline_filename="t.json",
        timeline_mark_cycles=True, autotune=True, autotune_log_file="a.csv", stall_check_seconds=30,
        stall_shutdown_seconds=90, log_level="WARNING"), cwd=str(tmp_path))
    assert env == {
        "HVDKERAS_FUSION_THRESHOLD": str(int(1.5 * 1024 * 1024)), "HVDKERAS_CYCLE_TIME": "3.5",
        "HVDKERAS_CACHE_CAPACITY": "0", "HVDKERAS_TIMELINE": str(tmp_path / "t.json"),
        "HVDKERAS_TIMELINE_MARK_CYCLES": "1", "HVDKERAS_AUTOTUNE": "1",
        "HVDKERAS_AUTOTUNE_LOG": str(tmp_path / "a.csv"), "HVDKERAS_STALL_CHECK_SECONDS": "30",
        "HVDKERAS_STALL_SHUTDOWN_SECONDS": "90", "HVDKERAS_LOG_LEVEL": "warning",
        "TF_CPP_MIN_LOG_LEVEL": "1",
    }
    assert knobs.knob_env(knobs.Knobs()) == {}
    assert knobs.knob_env(knobs.Knobs(no_stall_check=True)) == {"HVDKERAS_STALL_CHECK_DISABLE": "1"}
    # What the engine would read from that environment:
    from hvdkeras.engine.config import engine_config_from_env

    config = engine_config_from_env(knobs.knob_env(knobs.Knobs(fusion_threshold_mb=2, cycle_time_ms=7)))
    assert (config.fusion_threshold, config.cycle_time_ms) == (2 * 1024 * 1024, 7.0)


@pytest.mark.parametrize("kwargs, words", [
    ({"fusion_threshold_mb": -1}, "fusion-threshold-mb"), ({"fusion_threshold_mb": float("nan")}, "MiB"),
    ({"cycle_time_ms": 0}, "HVDKERAS_CYCLE_TIME"), ({"cache_capacity": -2}, "HVDKERAS_CACHE_CAPACITY"),
    ({"stall_check_seconds": -1}, "HVDKERAS_STALL_CHECK_SECONDS"), ({"log_level": "loud"}, "log-level"),
    ({"autotune_log_file": "x.csv"}, "needs --autotune"),
])
def test_knob_env_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        knobs.knob_env(knobs.Knobs(**kwargs))


# ---------------------------------------------------------------------------
# vendors and the mpiexec command
# ---------------------------------------------------------------------------

HYDRA_VERSION = "HYDRA build details:\n    Version:                                 5.0.2\n"
OMPI_VERSION = "mpiexec (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
INTEL_VERSION = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"


def test_vendor_detection():
    assert mpi_env.launcher_vendor(HYDRA_VERSION) == mpi_env.MPICH
    assert mpi_env.launcher_vendor(OMPI_VERSION) == mpi_env.OPENMPI
    assert mpi_env.launcher_vendor("prterun (PRRTE) 3.0.2") == mpi_env.OPENMPI
    assert mpi_env.launcher_vendor(INTEL_VERSION) == mpi_env.INTEL
    assert mpi_env.launcher_vendor("bash: mpiexec: not found") is None
    assert mpi_env.library_vendor("MPICH Version:      5.0.2\nMPICH Release date: ...") == mpi_env.MPICH
    assert mpi_env.library_vendor("Open MPI v4.1.4, package: Debian OpenMPI") == mpi_env.OPENMPI
    assert mpi_env.library_vendor("Intel(R) MPI Library 2021.10 for Linux* OS") == mpi_env.INTEL
    assert mpi_env.library_vendor("MVAPICH2 Version 2.3.7") == mpi_env.MPICH


def _executable(tmp_path, name):
    path = tmp_path / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_choose_mpiexec_skips_a_launcher_of_another_mpi(tmp_path):
    ompi, hydra = _executable(tmp_path, "ompi"), _executable(tmp_path, "hydra")
    versions = {ompi: OMPI_VERSION, hydra: HYDRA_VERSION}
    lib = mpi_env.MpiLibrary("/venv/lib/libmpi.so.12", "MPICH Version: 5.0.2", mpi_env.MPICH)
    assert mpi_env.choose_mpiexec(lib, [ompi, hydra], versions.get) == (hydra, mpi_env.MPICH)


@pytest.mark.parametrize("launcher, library, effect", [
    (OMPI_VERSION, ("MPICH Version: 5.0.2", mpi_env.MPICH), "abort"),
    (HYDRA_VERSION, ("Open MPI v4.1.4", mpi_env.OPENMPI), "world of size 1"),
])
def test_choose_mpiexec_explains_a_mismatch(tmp_path, launcher, library, effect):
    only = _executable(tmp_path, "mpiexec")
    lib = mpi_env.MpiLibrary("/x/lib/libmpi.so", *library)
    with pytest.raises(mpi_env.LauncherError, match=effect) as info:
        mpi_env.choose_mpiexec(lib, [only], lambda _: launcher)
    assert only in str(info.value) and "mpi4py loads" in str(info.value)


def test_choose_mpiexec_when_there_is_none(tmp_path):
    lib = mpi_env.MpiLibrary("/x/lib/libmpi.so", "MPICH", mpi_env.MPICH)
    with pytest.raises(mpi_env.LauncherError, match="no mpiexec found"):
        mpi_env.choose_mpiexec(lib, [str(tmp_path / "absent")], lambda _: "")


def test_candidate_mpiexecs_order(tmp_path):
    found = mpi_env.candidate_mpiexecs("/opt/mpich/lib/libmpi.so.12", "/venv/bin/python",
                                       environ={"PATH": ""})
    assert found[:3] == ["/opt/mpich/bin/mpiexec", "/opt/bin/mpiexec", "/venv/bin/mpiexec"]
    assert mpi_env.candidate_mpiexecs("/x/lib/libmpi.so", environ={"HVDKERAS_MPIEXEC": "/my/mpiexec"}) \
        == ["/my/mpiexec"]


def test_mpiexec_command_hydra_and_open_mpi():
    program = ["python", "shim.py", "--", "python", "train.py"]
    two = [HostSlots("a", 2), HostSlots("b", 2)]
    assert mpi_env.mpiexec_command(mpi_env.LaunchPlan("mpiexec", mpi_env.MPICH, 4, hosts=two), program) \
        == ["mpiexec", "-n", "4", "-hosts", "a:2,b:2", *program]
    assert mpi_env.mpiexec_command(
        mpi_env.LaunchPlan("mpiexec", mpi_env.MPICH, 2, hostfile="/tmp/hf", extra_args=("-launcher", "ssh")),
        program) == ["mpiexec", "-n", "2", "-f", "/tmp/hf", "-launcher", "ssh", *program]
    ompi = mpi_env.mpiexec_command(
        mpi_env.LaunchPlan("mpirun", mpi_env.OPENMPI, 4, hosts=two, env_names=("HVDKERAS_X",), as_root=True),
        program)
    assert ompi == ["mpirun", "-np", "4", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                    "--map-by", "slot", "-H", "a:2,b:2", "-x", "HVDKERAS_X", *program]
    assert "--allow-run-as-root" not in mpi_env.mpiexec_command(
        mpi_env.LaunchPlan("mpirun", mpi_env.OPENMPI, 1), program)
    with pytest.raises(ValueError):
        mpi_env.mpiexec_command(mpi_env.LaunchPlan("mpiexec", mpi_env.MPICH, 0), program)


def test_forwarded_env_names():
    names = mpi_env.forwarded_env_names(["MY_VAR"], {"HVDKERAS_CYCLE_TIME": "1", "HOME": "/root",
                                                     "PYTHONPATH": "/x", "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert names == ("MY_VAR", "HVDKERAS_CYCLE_TIME", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")


# ---------------------------------------------------------------------------
# restarts and failure reports
# ---------------------------------------------------------------------------


def test_restart_policy():
    policy = restart.RestartPolicy(max_restarts=2, backoff_s=1.0, max_backoff_s=3.0)
    assert policy.max_attempts == 3
    assert [policy.should_restart(a, 1) for a in (1, 2, 3)] == [True, True, False]
    assert not policy.should_restart(1, 0)
    assert not policy.should_restart(1, 1, interrupted=True)
    assert [policy.backoff(a) for a in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 3.0]
    assert not restart.RestartPolicy().should_restart(1, 3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            restart.RestartPolicy(max_restarts=bad)


def test_failure_report_names_the_first_rank():
    records = [
        {"rank": "1", "exit_code": 3, "signal": None, "host": "n1", "time": 1.0, "last_lines": ["[1]<stdout>: bye"]},
        {"rank": "0", "exit_code": 1, "signal": None, "host": "n0", "time": 2.0, "last_lines": []},
    ]
    message, code = failures.failure_report(records, 9, {})
    assert code == 3
    assert message.startswith("rank 1 on n1 exited with code 3 (then rank 0 failed too)")
    assert "last lines of rank 1:\n    [1]<stdout>: bye" in message
    message, code = failures.failure_report(
        [{"rank": "0", "exit_code": None, "signal": "SIGKILL", "time": 1.0, "last_lines": []}], 9,
        {"0": ["[0]<stdout>: from the launcher's copy"]})
    assert (code, message.splitlines()[0]) == (137, "rank 0 was killed by signal SIGKILL")
    assert "from the launcher's copy" in message
    message, code = failures.failure_report([], 255, {"mpiexec": ["ssh: connect refused"]})
    assert code == 255 and "no rank reported" in message and "ssh: connect refused" in message


def test_a_rank_that_only_saw_the_shutdown_is_not_blamed():
    """Rank 1 exits with an error; rank 0's next collective fails sooner than rank 1 finishes exiting."""
    records = [
        {"rank": "0", "exit_code": 1, "signal": None, "time": 1.0,
         "last_lines": ["[0]<stderr>: FailedPreconditionError: hvdkeras has been shut down, so collective 'x' cannot run."]},
        {"rank": "1", "exit_code": 4, "signal": None, "time": 2.0, "last_lines": ["[1]<stdout>: failing on purpose"]},
    ]
    message, code = failures.failure_report(records, 4, {})
    assert code == 4 and message.startswith("rank 1 exited with code 4 (then rank 0 failed too)")
    assert failures.is_casualty("hvdkeras was shut down (a rank called hvdkeras.shutdown() or exited)")
    assert not failures.is_casualty("ValueError: boom")


@pytest.mark.parametrize("kwargs, words", [
    ({"command": []}, "non-empty list"), ({"command": "python x.py"}, "non-empty list"),
    ({"np": 0}, "np must be"), ({"np": True}, "np must be"),
    ({"hosts": "a:1", "hostfile": "f"}, "not both"), ({"hosts": "localhost:1", "np": 2}, "more than the 1 slots"),
    ({"max_restarts": -1}, "max_restarts"), ({"env": {"A": 1}}, "env must map"),
    ({"hostfile": "/nonexistent/hostfile"}, "cannot read hostfile"),
])
def test_launch_rejects_bad_arguments(kwargs, words):
    arguments = {"command": ["python", "x.py"], "np": 1, **kwargs}
    with pytest.raises(ValueError, match=words):
        launch_mod.launch(**arguments)


def test_inherited_env_drops_the_callers_own_mpi_runtime():
    env = launch_mod.inherited_env({"PMI_FD": "9", "PMI_RANK": "1", "PMIX_NAMESPACE": "x",
                                    "OMPI_COMM_WORLD_RANK": "1", "MPI_LOCALRANKID": "0",
                                    "OMPI_MCA_btl": "tcp,self", "HVDKERAS_CYCLE_TIME": "2", "HOME": "/h"})
    assert env == {"OMPI_MCA_btl": "tcp,self", "HVDKERAS_CYCLE_TIME": "2", "HOME": "/h"}


def test_chain_connect_plan():
    assert chain_steps(0, 1) == []
    assert [chain_steps(i, 4) for i in range(4)] == [
        [("accept", 0)],
        [("accept", 1), ("connect", 0)],
        [("accept", 2), ("connect", 1), ("connect", 0)],
        [("connect", 2), ("connect", 1), ("connect", 0)],
    ]
    # Every port is accepted on exactly once and connected to by exactly one group.
    for size in range(1, 6):
        accepts = sorted(k for i in range(size) for a, k in chain_steps(i, size) if a == "accept")
        assert accepts == list(range(size - 1))
    with pytest.raises(ValueError):
        chain_steps(3, 3)


# ---------------------------------------------------------------------------
# the rank shim, run directly (no MPI)
# ---------------------------------------------------------------------------


def _shim(tmp_path, code, rank="5", extra=()):
    env = dict(os.environ, PMI_RANK=rank)
    return subprocess.run(
        [sys.executable, rank_shim.__file__, "--status-dir", str(tmp_path / "status"),
         "--log-dir", str(tmp_path / "logs"), "--attempt", "2", *extra, "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, env=env)


def test_shim_prefixes_lines_and_logs(tmp_path):
    result = _shim(tmp_path, "import sys; print('out 1'); print('out 2'); print('oops', file=sys.stderr); "
                             "sys.stdout.write('no newline')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[5]<stdout>: out 1\n[5]<stdout>: out 2\n[5]<stdout>: no newline\n"
    assert result.stderr == "[5]<stderr>: oops\n"
    log = (tmp_path / "logs" / "rank.5.log").read_text()
    assert log.startswith("=== attempt 2,") and "[5]<stderr>: oops" in log and "ended: exit code 0" in log
    assert rank_shim.read_statuses(str(tmp_path / "status")) == []


def test_shim_without_prefix(tmp_path):
    result = _shim(tmp_path, "print('plain')", extra=("--no-prefix",))
    assert (result.returncode, result.stdout) == (0, "plain\n")


def test_shim_reports_exit_code(tmp_path):
    result = _shim(tmp_path, "import sys; print('about to fail'); sys.exit(3)")
    assert result.returncode == 3
    [record] = rank_shim.read_statuses(str(tmp_path / "status"))
    assert (record["rank"], record["exit_code"], record["signal"], record["attempt"]) == ("5", 3, None, 2)
    assert record["last_lines"] == ["[5]<stdout>: about to fail"]


def test_shim_reports_a_signal(tmp_path):
    result = _shim(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", rank="1")
    assert result.returncode == 128 + signal.SIGKILL
    [record] = rank_shim.read_statuses(str(tmp_path / "status"))
    assert (record["rank"], record["exit_code"], record["signal"]) == ("1", None, "SIGKILL")


def test_shim_child_dies_with_the_shim(tmp_path):
    """SIGKILL to the shim takes the user's process with it (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [sys.executable, rank_shim.__file__, "--", sys.executable, "-c",
         f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text():
                break
            threading.Event().wait(0.05)
        child = int(pid_file.read_text())
        proc.kill()
        proc.wait(timeout=10)
        for _ in range(100):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the child outlived its shim")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_shim_missing_program(tmp_path):
    env = dict(os.environ, PMI_RANK="0")
    result = subprocess.run([sys.executable, rank_shim.__file__, "--status-dir", str(tmp_path),
                             "--", "/nonexistent/program"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 127 and "cannot start" in result.stderr
    assert rank_shim.read_statuses(str(tmp_path))[0]["exit_code"] == 127


def test_rank_from_env():
    assert rank_shim.rank_from_env({"PMI_RANK": "3"}) == "3"
    assert rank_shim.rank_from_env({"OMPI_COMM_WORLD_RANK": "2"}) == "2"
    assert rank_shim.rank_from_env({}) == "?"


# ---------------------------------------------------------------------------
# the HMAC-authenticated service
# ---------------------------------------------------------------------------


@pytest.fixture
def echo_service():
    calls = []

    def handler(kind, fields):
        calls.append((kind, fields))
        if kind == "fail":
            raise KeyError("nope")
        return {"kind": kind, **fields}

    secret = service.new_secret()
    with service.Service(secret, handler, host="127.0.0.1") as svc:
        yield svc, secret, calls


def test_service_round_trip(echo_service):
    svc, secret, calls = echo_service
    with service.Client(("127.0.0.1", svc.port), secret) as client:
        assert client.request("hello", x=1) == {"kind": "hello", "x": 1}
        assert client.request("again", blob=b"\0" * 100_000)["blob"] == b"\0" * 100_000
        with pytest.raises(service.ServiceError, match="KeyError"):
            client.request("fail")
    assert [kind for kind, _ in calls] == ["hello", "again", "fail"] and svc.rejected == 0


def test_service_rejects_a_wrong_hmac(echo_service):
    svc, secret, calls = echo_service
    with service.Client(("127.0.0.1", svc.port), service.new_secret()) as impostor:
        with pytest.raises(service.ServiceError, match="HMAC"):
            impostor.request("put_result", rank=0, blob=b"forged")
    assert calls == [] and svc.rejected == 1
    # The genuine client still works.
    with service.Client(("127.0.0.1", svc.port), secret) as client:
        assert client.request("ok") == {"kind": "ok"}


def _raw_connection(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    greeting = service._recv_exact(sock, len(service.MAGIC) + service.NONCE_BYTES)
    return sock, greeting[len(service.MAGIC):]


def _signed_header(secret, nonce, length, seq=0):
    header = service._HEADER.pack(length)
    return header + service._mac(secret, b"H", b"C", nonce, seq, header)


def _frame(secret, nonce, body, seq=0):
    return (_signed_header(secret, nonce, len(body), seq) + body
            + service._mac(secret, b"B", b"C", nonce, seq, body))


def _dropped(sock):
    """The server closed the connection without sending anything back."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def test_service_rejects_tampering_and_replay(echo_service):
    svc, secret, calls = echo_service
    body = pickle.dumps({"kind": "put_result", "rank": 0})
    # Tampered: a signed header, the body's HMAC made for another body.
    sock, nonce = _raw_connection(svc.port)
    evil = pickle.dumps({"kind": "put_result", "rank": 1})
    sock.sendall(_signed_header(secret, nonce, len(evil)) + evil
                 + service._mac(secret, b"B", b"C", nonce, 0, body))
    assert _dropped(sock)
    # Replayed: a frame recorded on one connection, sent on another (other nonce).
    sock, nonce = _raw_connection(svc.port)
    frame = _frame(secret, nonce, body)
    sock.sendall(frame)
    service.recv_frame(sock, secret, b"S", nonce, 0)  # the genuine request is answered
    sock.close()
    sock, _other_nonce = _raw_connection(svc.port)
    sock.sendall(frame)
    assert _dropped(sock)
    assert len(calls) == 1 and svc.rejected == 2


def test_service_reads_no_body_without_the_secret(echo_service):
    """A peer without the secret costs the 36-byte header, whatever length it claims."""
    svc, secret, calls = echo_service
    sock, _ = _raw_connection(svc.port)
    sock.sendall(service._HEADER.pack((1 << 31) - 1) + os.urandom(32))  # unsigned, 2 GiB claimed
    started = time.monotonic()
    assert _dropped(sock) and time.monotonic() - started < 5  # not waiting for the body
    sock, nonce = _raw_connection(svc.port)
    sock.sendall(_signed_header(secret, nonce, service.MAX_MESSAGE_BYTES + 1))  # signed, too long
    assert _dropped(sock)
    assert svc.rejected == 2 and calls == []
    with service.Client(("127.0.0.1", svc.port), secret) as client:
        assert client.request("after") == {"kind": "after"}


def test_service_limits_its_connections():
    secret = service.new_secret()
    with service.Service(secret, lambda kind, fields: kind, host="127.0.0.1",
                         max_connections=4) as svc:
        admitted = [_raw_connection(svc.port)[0] for _ in range(4)]  # greeted
        extra = [socket.create_connection(("127.0.0.1", svc.port), timeout=10) for _ in range(6)]
        assert all(_dropped(sock) for sock in extra)
        assert svc.refused == 6
        for sock in admitted:
            sock.close()
        deadline = time.monotonic() + 10
        while svc._active and time.monotonic() < deadline:
            time.sleep(0.05)
        with service.Client(("127.0.0.1", svc.port), secret) as client:
            assert client.request("served") == "served"


def test_service_needs_a_real_secret():
    with pytest.raises(ValueError):
        service.Service(b"short", lambda kind, fields: None)


def test_service_keeps_idle_clients_but_not_idle_strangers(echo_service, monkeypatch):
    svc, secret, calls = echo_service
    monkeypatch.setattr(service, "FIRST_REQUEST_S", 0.3)
    with service.Client(("127.0.0.1", svc.port), secret) as client:
        assert client.request("first") == {"kind": "first"}
        threading.Event().wait(1.0)  # a rank training for a while between requests
        assert client.request("later") == {"kind": "later"}
    stranger, _nonce = _raw_connection(svc.port)
    stranger.settimeout(10)
    assert stranger.recv(1) == b""  # dropped after the first-request timeout
    stranger.close()


def test_options_after_the_command_belong_to_the_command():
    """`--timeline` after the program is the program's, not a prefix of
    hvdkerasrun's --timeline-filename."""
    from hvdkeras.runner import cli

    args = cli.build_parser().parse_args(
        ["-np", "2", "python", "train.py", "--timeline", "t.json", "--np", "3"])
    assert args.np == 2
    assert args.command == ["python", "train.py", "--timeline", "t.json", "--np", "3"]


def test_a_rank_cut_off_from_rank_0_is_not_blamed():
    """Both sides of a cut link report it (Note [host liveness]): the rank that
    found its own host cut off wrote first, but rank 0's record names the lost
    host, so the report leads with rank 0's and an elastic restart leaves out
    only the lost host."""
    records = [
        {"rank": "2", "exit_code": 1, "signal": None, "host": "h1", "time": 1.0,
         "reason": "cut off from rank 0's host h0 (nothing from it for 15.0 s)",
         "cut_off": True, "silent_ranks": [], "last_lines": []},
        {"rank": "0", "exit_code": 1, "signal": None, "host": "h0", "time": 1.2,
         "reason": "lost host(s) h1: nothing from rank(s) 2, 3 for 15.0 s", "cut_off": False,
         "silent_ranks": [2, 3], "last_lines": []},
    ]
    message, code = failures.failure_report(records, 9, {})
    assert code == 1
    assert message.startswith("rank 0 on h0 failed with lost host(s) h1: nothing from rank(s) 2, 3")
    assert "(then rank 2 failed too)" in message


def test_a_rank_that_vanished_without_a_trace_is_named_first():
    from hvdkeras.runner.failures import failure_report

    lost = [{"rank": "0", "pid": 52, "host": "h0", "time": 2.0},
            {"rank": "1", "pid": 60, "host": "h1", "time": 2.1}]
    message, code = failure_report([], 255, {}, lost, vanished=[(2, "h2")])
    assert message.startswith("rank(s) 2 on h2 vanished without a trace"), message
    assert "then mpiexec ended rank(s) 0, 1" in message and code == 255
    message, _ = failure_report([], 255, {}, lost, vanished=[])
    assert message.startswith("the supervisor of rank 0"), message


def test_vanished_ranks_are_started_ones_without_any_record():
    from hvdkeras.runner.restart import _failed_hosts, _vanished

    started = [{"rank": "0", "host": "h0"}, {"rank": "1", "host": "h1"},
               {"rank": "2", "host": "h2"}]
    lost = [{"rank": "0", "host": "h0", "time": 1.0}, {"rank": "1", "host": "h1", "time": 1.1}]
    assert _vanished(started, [], lost) == [(2, "h2")]
    assert _vanished(started, [{"rank": 1}], lost) == []  # a rank reported: no guessing
    assert _vanished(started, [], []) == []
    # A finished rank removed its mark, and a host whose files are not seen left none.
    assert _vanished(started[:2], [], lost) == []
    assert _failed_hosts([], lost, [], [(2, "h2")]) == ["h2"]
    assert _failed_hosts([], lost, []) == ["h0"]

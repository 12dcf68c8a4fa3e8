"""`hvdkeras.spark.run` on a real local Spark (``local[2]``, barrier mode), and its service.

The Spark tests skip only when pyspark is not installed; CI installs the
``[spark]`` extra (scripts/setup_env.sh), so they run there. The service test
needs no Spark.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time

import pytest

from hvdkeras.runner import service as service_module
from hvdkeras.runner.service import Client, Service, ServiceError, new_secret

JOB_TIMEOUT = 240


def _pyspark():
    return pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")


@pytest.fixture(scope="module")
def spark(op_library_built):
    _pyspark()
    saved = {k: os.environ.get(k) for k in ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "TF_CPP_MIN_LOG_LEVEL")}
    os.environ.update({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                       "TF_CPP_MIN_LOG_LEVEL": "2"})
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("hvdkeras-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 120)
def test_spark_run_allreduces_the_ranks(spark, monkeypatch, tmp_path):
    import hvdkeras.spark
    import hvdkeras.spark.runner as spark_runner

    weights = {0: "first", 1: "second"}  # driver-side data in the closure
    secret = new_secret()
    monkeypatch.setattr(spark_runner, "new_secret", lambda: secret)
    secret_hex = secret.hex().encode()

    def fn(scale):
        import glob
        import tempfile

        import hvdkeras as hvd  # init already ran on the tasks' world

        total = hvd.allreduce([float(hvd.rank())], op=hvd.Sum, name="rank_sum")
        # The job's secret is in no process's environment or command line, and
        # its hand-over file is gone once the rank started.
        leaks = []
        for proc in glob.glob("/proc/[0-9]*"):
            for part in ("environ", "cmdline"):
                try:
                    with open(f"{proc}/{part}", "rb") as f:
                        if secret_hex in f.read():
                            leaks.append(f"{proc}/{part}")
                except OSError:
                    pass
        leaks += glob.glob(f"{tempfile.gettempdir()}/hvdkeras-spark-*.key")
        return hvd.rank(), hvd.size(), weights[hvd.rank()], scale * float(total.numpy()[0]), leaks

    results = hvdkeras.spark.run(fn, args=(1,), num_proc=2, timeout=JOB_TIMEOUT)
    assert [r[:4] for r in results] == [(0, 2, "first", 1.0), (1, 2, "second", 1.0)]
    assert [r[3] for r in results] == [1, 1]
    assert [r[4] for r in results] == [[], []]


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 120)
def test_spark_rank_exception_surfaces_with_its_traceback(spark):
    import hvdkeras
    import hvdkeras.spark

    # Nested, so cloudpickle ships it by value (executors cannot import this test module).
    def _spark_failure(rank):
        raise KeyError(f"no shard for rank {rank}")

    def fn():
        import hvdkeras as hvd

        if hvd.rank() == 1:
            _spark_failure(hvd.rank())
        hvd.allreduce([1.0], name="rank_0_waits_here")

    started = time.time()
    with pytest.raises(hvdkeras.RankFailedError) as info:
        hvdkeras.spark.run(fn, num_proc=2, timeout=JOB_TIMEOUT)
    assert time.time() - started < JOB_TIMEOUT / 2
    assert info.value.rank == 1
    assert str(info.value).startswith("rank 1 of 2 raised KeyError")
    assert "in _spark_failure" in str(info.value)


def test_driver_service_rejects_a_wrong_hmac():
    """The service spark.run starts: a request with a wrong HMAC is dropped and changes nothing."""
    from hvdkeras.spark.runner import _JobState

    state = _JobState(pickle.dumps("the pickled function"), size=2)
    secret = new_secret()
    with Service(secret, state.handle, host="127.0.0.1") as service:
        address = ("127.0.0.1", service.port)
        for kind, fields in (("task", {}), ("put_port", {"index": 0, "port": "forged"}),
                             ("put_error", {"record": {"rank": 0, "type": "X", "time": 0.0}})):
            with Client(address, new_secret()) as impostor:
                with pytest.raises(ServiceError, match="HMAC"):
                    impostor.request(kind, **fields)
        assert service.rejected == 3 and service.served == 0
        assert state.ports == {} and state.errors == [] and state.abort_reason is None
        with Client(address, secret) as genuine:
            assert pickle.loads(genuine.request("task")) == "the pickled function"
            genuine.request("put_port", index=1, port="tag#0$...")
            assert genuine.request("get_ports") == {"ports": None, "abort": None}
        assert state.ports == {1: "tag#0$..."}


# --- the service under hostile clients (no Spark needed) ----------------------

def _raw(address):
    sock = socket.create_connection(address, timeout=10)
    greeting = b""
    while len(greeting) < len(service_module.MAGIC) + service_module.NONCE_BYTES:
        chunk = sock.recv(64)
        if not chunk:
            break
        greeting += chunk
    return sock, greeting[len(service_module.MAGIC):]


def _closed_without_answer(sock):
    """The server dropped the connection (EOF) without sending anything back."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


def _echo(kind, fields):
    return fields.get("x")


def test_service_reads_no_body_without_the_secret():
    """Unsigned, oversized, wrongly signed and replayed requests are dropped, reading
    at most the 36-byte header of a peer without the secret."""
    secret = new_secret()
    frame = service_module._HEADER
    with Service(secret, _echo, host="127.0.0.1") as service:
        address = service.address
        # Unsigned: claims 2 GiB - 1 and sends nothing more; the service must not wait for it.
        sock, _ = _raw(address)
        sock.sendall(frame.pack((1 << 31) - 1) + os.urandom(32))
        started = time.monotonic()
        assert _closed_without_answer(sock) and time.monotonic() - started < 5
        # Signed header, but a length over the cap.
        sock, nonce = _raw(address)
        header = frame.pack(service_module.MAX_MESSAGE_BYTES + 1)
        sock.sendall(header + service_module._mac(secret, b"H", b"C", nonce, 0, header))
        assert _closed_without_answer(sock)
        # Signed header, wrongly signed body.
        sock, nonce = _raw(address)
        body = pickle.dumps({"kind": "echo", "x": 1})
        header = frame.pack(len(body))
        sock.sendall(header + service_module._mac(secret, b"H", b"C", nonce, 0, header) + body
                     + os.urandom(32))
        assert _closed_without_answer(sock)
        # Replayed: a genuine frame from one connection sent on another.
        sock_a, nonce_a = _raw(address)
        body = pickle.dumps({"kind": "echo", "x": "replayed"})
        header = frame.pack(len(body))
        genuine = (header + service_module._mac(secret, b"H", b"C", nonce_a, 0, header) + body
                   + service_module._mac(secret, b"B", b"C", nonce_a, 0, body))
        sock_b, _ = _raw(address)
        sock_b.sendall(genuine)
        assert _closed_without_answer(sock_b)
        sock_a.close()
        assert service.rejected == 4 and service.served == 0
        with Client(address, secret) as client:
            assert client.request("echo", x=42) == 42


def test_service_limits_its_connections():
    secret = new_secret()
    with Service(secret, _echo, host="127.0.0.1", max_connections=4) as service:
        flood = [_raw(service.address)[0] for _ in range(4)]  # greeted: admitted
        extra = []
        for _ in range(6):
            sock = socket.create_connection(service.address, timeout=10)
            extra.append(sock)
        assert all(_closed_without_answer(sock) for sock in extra)
        assert service.refused == 6
        for sock in flood:
            sock.close()
        deadline = time.monotonic() + 10
        while service._active and time.monotonic() < deadline:
            time.sleep(0.05)
        with Client(service.address, secret) as client:
            assert client.request("echo", x="served") == "served"


def test_driver_service_listens_on_the_driver_address_only():
    from hvdkeras.spark.runner import service_bind_address

    assert service_bind_address("127.0.0.1") == "127.0.0.1"
    assert service_bind_address("localhost") == "127.0.0.1"
    assert service_bind_address("no-such-host.invalid") == ""
    with Service(new_secret(), _echo, host=service_bind_address("localhost")) as service:
        assert service.address[0] == "127.0.0.1"

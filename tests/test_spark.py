"""`hvdkeras.spark.run` on a real local Spark (``local[2]``, barrier mode), and its service.

The Spark tests skip only when pyspark is not installed; CI installs the
``[spark]`` extra (scripts/setup_env.sh), so they run there. The service test
needs no Spark.
"""

from __future__ import annotations

import os
import pickle
import sys
import time

import pytest

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


# --- where the driver's service listens (no Spark needed) ----------------------

def test_driver_service_listens_on_the_driver_address_only():
    from hvdkeras.spark.runner import service_bind_address

    assert service_bind_address("127.0.0.1") == "127.0.0.1"
    assert service_bind_address("localhost") == "127.0.0.1"
    assert service_bind_address("no-such-host.invalid") == ""
    with Service(new_secret(), lambda kind, fields: None,
                 host=service_bind_address("localhost")) as service:
        assert service.address[0] == "127.0.0.1"

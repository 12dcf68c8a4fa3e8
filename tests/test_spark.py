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
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_spark_run_takes_horovods_launch_arguments(spark):
    """extra_mpi_args reach each task's mpiexec (here: MPICH's -env sets a
    variable in the rank), executable picks the ranks' Python, and the output
    options are accepted; nics is refused with what to do instead."""
    import hvdkeras.spark

    def fn():
        import os
        import sys
        return os.environ.get("HVDKERAS_TEST_MARK"), sys.executable

    results = hvdkeras.spark.run(fn, num_proc=2, timeout=JOB_TIMEOUT,
                                 extra_mpi_args="-env HVDKERAS_TEST_MARK 7",
                                 executable=sys.executable, stdout=sys.stdout,
                                 stderr=sys.stderr, verbose=2,
                                 prefix_output_with_timestamp=True)
    assert results == [("7", sys.executable)] * 2
    with pytest.raises(ValueError, match="FI_TCP_IFACE"):
        hvdkeras.spark.run(fn, num_proc=2, nics=["eth0"])


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_horovod_runner_with_positive_np_runs_on_spark(spark):
    """HorovodRunner's rule: with a SparkContext, Runner(np > 0) uses Spark tasks."""
    import hvdkeras

    def where(tag):
        import os

        import hvdkeras as hvd
        return tag, hvd.rank(), os.environ.get("HVDKERAS_TASK_INDEX")

    assert hvdkeras.Runner(2, timeout=JOB_TIMEOUT).run(where, tag="t") == ("t", 0, "0")


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
    from hvdkeras.cluster.job import JobState

    state = JobState(pickle.dumps("the pickled function"), size=2)
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


def _digits_frame(spark):
    from pyspark.ml.feature import VectorAssembler

    path = os.path.join(hvdkeras_package_dir(), "data", "digits.parquet")
    frame = spark.read.parquet(path)
    pixels = [c for c in frame.columns if c.startswith("p")]
    return VectorAssembler(inputCols=pixels, outputCol="features").transform(frame) \
        .select("features", "label")


def hvdkeras_package_dir() -> str:
    import hvdkeras
    return os.path.dirname(os.path.abspath(hvdkeras.__file__))


def _digits_estimator(store, num_proc, batch_size, epochs, shuffle=True, validation=None):
    import keras

    from hvdkeras.spark.keras import KerasEstimator

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    return KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.05),
                          loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                          feature_cols=["features"], label_cols=["label"],
                          batch_size=batch_size, epochs=epochs, store=store, num_proc=num_proc,
                          shuffle=shuffle, validation=validation, random_seed=1, verbose=0)


@pytest.mark.slow
@pytest.mark.timeout(3 * JOB_TIMEOUT)
def test_keras_estimator_trains_on_a_dataframe_and_predicts(spark, tmp_path):
    """fit(df) on 2 Spark tasks from a Parquet copy in the store; the returned
    Transformer adds predictions and keeps the other columns (vectors too)."""
    import numpy as np

    from hvdkeras.spark.keras import Store

    df = _digits_frame(spark)
    store = Store.create(str(tmp_path / "store"))
    estimator = _digits_estimator(store, num_proc=2, batch_size=32, epochs=15,
                                  validation=0.1)
    model = estimator.fit(df)
    assert os.path.exists(store.get_checkpoint_path(model.run_id))
    assert set(model.getHistory()) >= {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert model.getHistory()["loss"][-1] < model.getHistory()["loss"][0]
    predicted = model.setOutputCols(["label_prob"]).transform(df)
    assert predicted.columns == ["features", "label", "label_prob"]
    rows = predicted.collect()
    assert len(rows) == 1797 and len(rows[0]["features"]) == 64
    accuracy = np.mean([int(np.argmax(r["label_prob"])) == r["label"] for r in rows])
    assert accuracy > 0.9, accuracy


@pytest.mark.slow
@pytest.mark.timeout(3 * JOB_TIMEOUT)
def test_keras_estimator_two_ranks_equal_one_process_on_the_global_batch(spark, tmp_path):
    """Without shuffling, 2 ranks of batch 16 train exactly as 1 rank of batch 32."""
    import keras
    import numpy as np

    from hvdkeras.spark.keras import Store

    df = _digits_frame(spark).repartition(1)  # one Parquet file: one row order
    weights = []
    for num_proc, batch in ((1, 32), (2, 16)):
        store = Store.create(str(tmp_path / f"store{num_proc}"))
        model = _digits_estimator(store, num_proc, batch, epochs=2, shuffle=False).fit(df)
        weights.append(keras.models.load_model(model.model_path).get_weights())
    for single, pair in zip(*weights):
        np.testing.assert_allclose(pair, single, rtol=1e-4, atol=1e-6)


def test_keras_estimator_rejects_bad_arguments(tmp_path):
    _pyspark()
    import keras

    from hvdkeras.spark.keras import KerasEstimator, Store

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    good = dict(model=model, optimizer=keras.optimizers.SGD(), loss="mse",
                feature_cols=["x"], label_cols=["y"], store=Store.create(str(tmp_path)))
    with pytest.raises(ValueError, match="needs a Keras 3 model"):
        KerasEstimator(**{**good, "model": "model"})
    with pytest.raises(ValueError, match="store=Store.create"):
        KerasEstimator(**{**good, "store": str(tmp_path)})
    with pytest.raises(ValueError, match="validation must be a fraction"):
        KerasEstimator(**good, validation=2)
    with pytest.raises(ValueError, match="hdfs:// is not supported"):
        Store.create("hdfs://namenode/runs")

"""A Spark driver for the Spark standalone cluster on the network lab
(tests/test_spark_cluster.py): run in a process of its own, so that its
SparkContext is not the test session's.

    python spark_lab_driver.py MASTER DRIVER_ADDRESS NUM_PROC MODE READY_DIR

MODE is `run` (hvdkeras.spark.run: each rank's host and its allreduce),
`estimator` (KerasEstimator.fit on the bundled digits, then its accuracy)
or `lost` (ranks loop on allreduces; each writes READY_DIR/ready.<rank> with
its host, and the test takes one host down). Prints RESULT/EXECUTORS/FAILED
lines for the test to read.
"""

import os
import socket
import sys
import time

master, driver_host, num_proc, mode, ready_dir = sys.argv[1:6]
num_proc = int(num_proc)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["HVDKERAS_SPARK_DRIVER_HOST"] = driver_host

from pyspark.sql import SparkSession  # noqa: E402

spark = (SparkSession.builder.master(master).appName(f"hvdkeras-lab-{mode}")
         .config("spark.driver.host", driver_host).config("spark.driver.bindAddress", driver_host)
         .config("spark.executor.cores", "1").config("spark.cores.max", str(num_proc))
         .config("spark.executor.memory", "2g").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

import hvdkeras.spark  # noqa: E402
from hvdkeras.runner.function_runner import RankFailedError  # noqa: E402


def executors() -> list:
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()
    hosts = sorted(str(k).split(":")[0] for k in spark.sparkContext._jvm.scala.collection
                   .JavaConverters.mapAsJavaMapConverter(status).asJava().keySet())
    return [h for h in hosts if h != driver_host]


def ranks_and_hosts():
    import tensorflow as tf

    import hvdkeras as hvd

    hvd.init()
    total = hvd.allreduce(tf.fill([4], float(hvd.rank() + 1)), op=hvd.Sum, name="x")
    return hvd.rank(), socket.gethostname(), float(total.numpy()[0])


def loop_until_lost(directory):
    import tensorflow as tf

    import hvdkeras as hvd

    hvd.init()
    x = tf.ones([1 << 14])
    for step in range(10 ** 7):
        hvd.allreduce(x, name=f"loop.{step % 4}")
        if step == 5:
            path = os.path.join(directory, f"ready.{hvd.rank()}")
            with open(path + ".tmp", "w") as f:
                f.write(socket.gethostname())
            os.replace(path + ".tmp", path)
        time.sleep(0.01)


start = time.monotonic()
if mode == "run":
    for rank, host, total in hvdkeras.spark.run(ranks_and_hosts, num_proc=num_proc):
        print(f"RESULT rank {rank} host {host} sum {total:g}", flush=True)
elif mode == "estimator":
    import keras
    import numpy as np
    from pyspark.ml.feature import VectorAssembler

    import hvdkeras
    from hvdkeras.spark.keras import KerasEstimator, Store

    path = os.path.join(os.path.dirname(os.path.abspath(hvdkeras.__file__)), "data",
                        "digits.parquet")
    frame = spark.read.parquet(path)
    pixels = [c for c in frame.columns if c.startswith("p")]
    df = VectorAssembler(inputCols=pixels, outputCol="features").transform(frame) \
        .select("features", "label")
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    estimator = KerasEstimator(model=model, optimizer=keras.optimizers.SGD(0.05),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                               feature_cols=["features"], label_cols=["label"], batch_size=32,
                               epochs=10, store=Store.create(os.path.join(ready_dir, "store")),
                               num_proc=num_proc, random_seed=1, verbose=0)
    fitted = estimator.fit(df)
    rows = fitted.setOutputCols(["label_prob"]).transform(df).collect()
    accuracy = np.mean([int(np.argmax(r["label_prob"])) == r["label"] for r in rows])
    print(f"RESULT accuracy {accuracy:.4f} rows {len(rows)}", flush=True)
elif mode == "lost":
    try:
        hvdkeras.spark.run(loop_until_lost, args=(ready_dir,), num_proc=num_proc,
                           env={"HVDKERAS_LIVENESS_SECONDS": "10"})
        print("UNREACHABLE: the run ended without an error", flush=True)
    except RankFailedError as error:
        print(f"FAILED after {time.monotonic() - start:.1f} s: {error}", flush=True)
print(f"EXECUTORS {' '.join(executors())}", flush=True)
print(f"TOOK {time.monotonic() - start:.1f} s", flush=True)
spark.stop()

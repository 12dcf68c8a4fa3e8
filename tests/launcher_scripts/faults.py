"""One fault on 2 ranks, chosen by argv[1], while the other rank is busy.

raise:  rank 1 raises right after init() while rank 0 computes outside any
        collective (sleeps 300 s).
hang:   rank 0 hangs forever inside a Keras callback while rank 1 waits in
        the next step's gradient allreduce.
stop:   rank 1 stops itself (SIGSTOP) while rank 0 waits in an allreduce.
wait:   both ranks print READY and sleep (the test kills something).
Every rank prints "<PHASE> <rank> <pid> <time>" lines the test reads.
"""
import os
import sys
import time

import hvdkeras as hvd

mode = sys.argv[1]
hvd.init()
rank = hvd.rank()
print(f"READY {rank} {os.getpid()} {time.time():.3f}", flush=True)

if mode == "raise":
    if rank == 1:
        print(f"FAILING_AT {time.time():.3f}", flush=True)
        raise RuntimeError("rank 1 broke right after init")
    time.sleep(300)
    print("UNREACHABLE: rank 0 finished its computation", flush=True)
elif mode == "hang":
    import numpy as np
    import keras

    class HangOnRank0(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if rank == 0 and batch == 2:
                print(f"HANGING_AT {time.time():.3f}", flush=True)
                time.sleep(3600)

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x = np.ones((64, 4), "float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), HangOnRank0()])
    print("UNREACHABLE: fit returned", flush=True)
elif mode == "stop":
    import signal

    import tensorflow as tf

    hvd.allreduce(tf.constant(1.0), name="before")
    if rank == 1:
        print(f"STOPPING_AT {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    hvd.allreduce(tf.constant(1.0), name="after")
    print("UNREACHABLE: the allreduce returned", flush=True)
elif mode == "wait":
    time.sleep(300)
    print("UNREACHABLE: the wait ended", flush=True)

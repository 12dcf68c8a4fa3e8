"""One run of a checkpointed training job, for the stop/crash/restart tests.

Run under mpiexec. Trains a small model for --epochs epochs with rank-0
checkpoints in --dir (if given), optionally resuming from them first, and
writes rank 0's final weights and optimizer state to --out. With
--crash-writing-epoch N, rank 0 dies (os._exit) in the middle of writing the
checkpoint of epoch N, leaving a partial temporary file, as a killed job would.
"""

import argparse
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd

state = {"epoch": 0, "crash_at": None}


@keras.saving.register_keras_serializable(package="hvdkeras_tests")
class CrashWhileSaving(keras.layers.Layer):
    """Identity layer that kills rank 0 while its weights are being saved."""

    def call(self, inputs):
        return inputs

    def save_own_variables(self, store):
        if state["crash_at"] == state["epoch"] + 1 and hvd.rank() == 0:
            print(f"crashing while writing the checkpoint of epoch {state['epoch'] + 1}",
                  flush=True)
            os._exit(17)


class TrackEpoch(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        state["epoch"] = epoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--out")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--crash-writing-epoch", type=int)
    args = parser.parse_args()
    state["crash_at"] = args.crash_writing_epoch

    hvd.init()
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(1000 + hvd.rank())   # ranks differ until synced
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              CrashWhileSaving(), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_lr(0.01))),
                  loss="mse")
    initial_epoch = 0
    if args.resume:
        initial_epoch = hvd.restore_from_checkpoint(model, args.dir)

    rng = np.random.default_rng(7 + hvd.rank())
    x = rng.normal(size=(16, 6)).astype("float32")
    y = rng.normal(size=(16, 2)).astype("float32")
    callbacks = [TrackEpoch()]
    callbacks += hvd.callbacks.standard_callbacks(
        warmup_initial_lr=hvd.scale_lr(0.01), warmup_epochs=2,
        checkpoint_dir=args.dir, keep_last=3, verbose=1) if args.dir else \
        hvd.callbacks.standard_callbacks(warmup_initial_lr=hvd.scale_lr(0.01), warmup_epochs=2)
    model.fit(x, y, batch_size=4, epochs=args.epochs, initial_epoch=initial_epoch,
              shuffle=False, verbose=hvd.fit_verbose(), callbacks=callbacks)

    values = [np.asarray(v) for v in model.get_weights()]
    values += [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.optimizer.variables]
    flat = np.concatenate([v.ravel().astype(np.float64) for v in values])
    spread = hvd.allreduce(tf.constant(np.concatenate([flat, -flat])), op=hvd.Max).numpy()
    if not np.array_equal(spread[: flat.size], -spread[flat.size:]):
        print("ranks ended with different state", flush=True)
        sys.exit(3)
    if hvd.rank() == 0 and args.out:
        np.savez(args.out, initial_epoch=initial_epoch, *values)
        print(f"ranks identical; initial_epoch={initial_epoch}", flush=True)


if __name__ == "__main__":
    main()

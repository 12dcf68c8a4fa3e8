"""Sharded checkpoints across rank counts, for tests/test_zero.py.

Run under mpiexec. `save DIR`: trains a small model with zero_stage=2 for
two epochs, with checkpoints in DIR. `resume DIR STAGE OUT`: restores the
newest checkpoint of DIR into a model whose optimizer has zero_stage=STAGE (0 to 3)
(on however many ranks this job has), checks that every slot now equals the
file's value exactly (gathered through a normal save, read by plain Keras),
trains one more epoch and writes rank 0's final weights to OUT (.npz).
"""

import os
import sys

import keras
import numpy as np

import hvdkeras as hvd

ROWS = 24  # global rows per epoch, split evenly over 2, 3 or 4 ranks


def model_for(stage: int) -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                     zero_stage=stage), loss="mse")
    return model


def fit(model: keras.Model, epochs: int, initial_epoch: int, directory: str) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(ROWS, 6)).astype("float32")
    y = rng.normal(size=(ROWS, 2)).astype("float32")
    per = ROWS // hvd.size()
    mine = slice(hvd.rank() * per, (hvd.rank() + 1) * per)
    model.fit(x[mine], y[mine], batch_size=per // 2, epochs=epochs, initial_epoch=initial_epoch,
              shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.CheckpointCallback(directory, keep_last=None)])


def file_state(path: str) -> list:
    plain = keras.models.load_model(path)
    return [np.asarray(v) for v in plain.optimizer.variables]


def main() -> None:
    hvd.init()
    mode, directory = sys.argv[1], sys.argv[2]
    if mode == "save":
        fit(model_for(2), 2, 0, directory)
        return
    stage, out = int(sys.argv[3]), sys.argv[4]
    model = model_for(stage)
    assert hvd.restore_from_checkpoint(model, directory, verbose=0) == 2
    check = os.path.join(directory, f"restored-{hvd.size()}.keras.tmp.keras")
    with hvd.gathered_optimizer_state(model):
        if hvd.rank() == 0:
            model.save(check)
    if hvd.rank() == 0:
        restored = file_state(check)
        original = file_state(os.path.join(directory, "epoch-00002.keras"))
        assert len(restored) == len(original) > 2
        for got, want in zip(restored, original):
            np.testing.assert_array_equal(got, want)
        os.remove(check)
        print(f"restored {len(original)} optimizer variables exactly on {hvd.size()} ranks",
              flush=True)
    fit(model, 3, 2, os.path.join(directory, f"after-{hvd.size()}-{stage}"))
    weights = model.get_weights()  # every rank: at stage 3 reading the weights is a collective
    if hvd.rank() == 0:
        np.savez(out, *weights)


if __name__ == "__main__":
    main()

"""Saves `.keras` files of models trained with DistributedOptimizer (under
mpiexec), and checks they load back with hvdkeras imported and train on.

Usage: mpiexec -n 2 python save_models.py OUTDIR
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd
from saved_models import EXPECTED, data, make_model, make_optimizer, state


def barrier(name):
    hvd.allreduce(tf.zeros([1]), name=name)


def same_on_all_ranks(values, name):
    flat = np.concatenate([np.asarray(v, np.float64).ravel() for v in values])
    out = hvd.allreduce(tf.constant(np.concatenate([flat, -flat])), op=hvd.Max, name=name).numpy()
    return np.array_equal(out[: flat.size], -out[flat.size:])


def main(outdir):
    hvd.init()
    for name, (class_name, inner_name, policy) in EXPECTED.items():
        model = make_model(name, seed=5 + hvd.rank())
        keras.config.set_dtype_policy(policy)      # DistributedOptimizer adds the LSO itself
        optimizer = hvd.DistributedOptimizer(make_optimizer(name), backward_passes_per_step=2
                                             if name == "custom_subclass" else 1)
        keras.config.set_dtype_policy("float32")
        model.compile(optimizer=optimizer, loss="mse")
        x, y = data(seed=hvd.rank())
        model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        path = os.path.join(outdir, f"{name}.keras")
        if hvd.rank() == 0:
            hvd.save_model_atomic(model, path)
            np.savez(os.path.join(outdir, f"{name}.npz"), *state(model))
        barrier(f"saved_{name}")

        loaded = keras.saving.load_model(path)
        assert type(loaded.optimizer).__name__ == class_name, type(loaded.optimizer)
        assert not hvd.is_distributed(loaded.optimizer)
        if inner_name:
            assert type(loaded.optimizer.inner_optimizer).__name__ == inner_name
        for got, want in zip(state(loaded), state(model)):
            np.testing.assert_array_equal(got, want)
        # Wrap again and keep training on every rank, in step.
        loaded.optimizer = hvd.DistributedOptimizer(loaded.optimizer)
        loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert same_on_all_ranks(state(loaded), f"check_{name}"), name
        print(f"rank {hvd.rank()}: {name} round trip with hvdkeras ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

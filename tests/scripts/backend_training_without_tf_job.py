"""Under torch or jax, a user's whole training run leaves TensorFlow out of the
process: a distributed optimizer (fp16 wire compression, optionally sharded
state), the standard callbacks with rank-0 checkpoints, the best-model
checkpoint, resuming from the newest checkpoint, `load_model`, the object
collectives and the sharded state's gathering for a save.

Keras itself imports TensorFlow when it can (`model.save`,
`keras.utils.set_random_seed`), so this job makes it unimportable first, as
on a machine without it, and records every attempt made from hvdkeras's own
code (a lookup of its files by `importlib.util.find_spec` is no import).

Usage: backend_training_without_tf_job.py DIRECTORY ZERO_STAGE. Prints, on
each rank, "rank R tensorflow_imported False hvdkeras_tried []" when
TensorFlow stayed out.
"""

import os
import sys
import traceback

tried = []


class NoTensorFlow:
    """A finder that refuses `import tensorflow`, noting hvdkeras's attempts."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "tensorflow":
            return None
        frames = traceback.extract_stack()[:-1]
        if any(f.filename == "<frozen importlib.util>" for f in frames):
            return None  # a lookup of where it is installed, not an import
        importer = [f for f in frames if not f.filename.startswith("<frozen")][-1]
        if f"{os.sep}hvdkeras{os.sep}" in importer.filename:
            tried.append(f"{importer.filename}:{importer.lineno}")
        raise ImportError(f"{name} is made unimportable by this test job")


sys.meta_path.insert(0, NoTensorFlow())

import keras  # noqa: E402  (after the finder)
import numpy as np  # noqa: E402

import hvdkeras as hvd  # noqa: E402

directory, zero_stage = sys.argv[1], int(sys.argv[2])
hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(64, 6)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")


def make_model() -> keras.Model:
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_lr(1e-2)),
                                         compression=hvd.Compression.fp16,
                                         zero_stage=zero_stage)
    model.compile(optimizer=optimizer, loss="mse")
    return model


model = make_model()
checkpoints = os.path.join(directory, "checkpoints")
callbacks = hvd.callbacks.standard_callbacks(warmup_initial_lr=hvd.scale_lr(1e-2),
                                             warmup_epochs=1, checkpoint_dir=checkpoints)
callbacks.append(hvd.callbacks.BestModelCheckpoint(os.path.join(directory, "best.keras"),
                                                   monitor="loss"))
model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)

again = make_model()
epoch = hvd.restore_from_checkpoint(again, checkpoints, verbose=0)
assert epoch == 2, epoch
with hvd.gathered_optimizer_state(again):
    if hvd.rank() == 0:
        again.save(os.path.join(directory, "final.keras"))
hvd.barrier()
loaded = hvd.load_model(os.path.join(directory, "final.keras"))
assert hvd.is_distributed(loaded.optimizer)
assert hvd.broadcast_object({"epoch": epoch} if hvd.rank() == 0 else None) == {"epoch": 2}
assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))
assert 0 <= hvd.join() < hvd.size()
print(f"rank {hvd.rank()} tensorflow_imported {'tensorflow' in sys.modules} "
      f"hvdkeras_tried {tried}", flush=True)
hvd.shutdown()

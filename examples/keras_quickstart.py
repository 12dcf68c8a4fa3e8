"""A plain Keras 3 training script, made data-parallel with hvdkeras.

Every line marked `# hvdkeras:` is a change from the single-process script;
remove them (and use the full data set) and it is ordinary Keras again.

Run on 4 processes:

    mpiexec -n 4 python examples/keras_quickstart.py --epochs 5 --checkpoint-dir ckpt

Run the same command again and it resumes from the newest checkpoint.
"""

import argparse

import keras
import numpy as np

import hvdkeras as hvd                                   # hvdkeras: import

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--checkpoint-dir", default=None)
args = parser.parse_args()

hvd.init()                                               # hvdkeras: start (once, first)
hvd.pin_gpu()                                            # hvdkeras: one GPU per process


def load_data(seed, rows=4096):
    """A synthetic 10-class problem (stands in for your data set)."""
    centers = np.random.default_rng(0).normal(scale=1.0, size=(10, 20))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=rows)
    features = centers[labels] + rng.normal(size=(rows, 20))
    return features.astype("float32"), labels.astype("int32")


x_train, y_train = load_data(seed=1)
x_test, y_test = load_data(seed=2, rows=1024)
# hvdkeras: each process trains on its own shard (the global batch is
# batch_size * hvd.size()).
x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]

keras.utils.set_random_seed(42)
model = keras.Sequential([
    keras.Input((20,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10),
])

learning_rate = hvd.scale_lr(1e-3)                       # hvdkeras: lr * number of processes
optimizer = keras.optimizers.Adam(learning_rate)
optimizer = hvd.DistributedOptimizer(optimizer)          # hvdkeras: average gradients
model.compile(optimizer=optimizer,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

initial_epoch = 0
if args.checkpoint_dir:                                  # hvdkeras: resume all ranks alike
    initial_epoch = hvd.restore_from_checkpoint(model, args.checkpoint_dir)

model.fit(
    x_train, y_train, batch_size=32, epochs=args.epochs, initial_epoch=initial_epoch,
    validation_data=(x_test, y_test),
    # hvdkeras: sync the start, average metrics, warm up the scaled lr,
    # checkpoint on rank 0 only.
    callbacks=hvd.callbacks.standard_callbacks(
        warmup_initial_lr=learning_rate, warmup_epochs=2,
        callbacks=[keras.callbacks.ReduceLROnPlateau(patience=2)],
        checkpoint_dir=args.checkpoint_dir),
    verbose=hvd.fit_verbose(),                           # hvdkeras: rank 0 prints, others stay quiet
)

loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
if hvd.rank() == 0:                                      # hvdkeras: print once
    print(f"test accuracy: {accuracy:.3f}")

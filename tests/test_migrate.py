"""`hvdkeras migrate`: Horovod + Keras 2 scripts rewritten for hvdkeras + Keras 3.

Each rule on its own (the exact text it produces, comments and layout kept),
a whole Horovod-style Keras script (the result compiles, every change is in
the report, what cannot be changed is named), and the command line
(-o, --diff, bad input).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hvdkeras.migrate import migrate


def _rewrite(source: str) -> str:
    result = migrate(textwrap.dedent(source))
    compile(result.text, "<migrated>", "exec")
    return result.text


@pytest.mark.parametrize("before, after", [
    ("import horovod.tensorflow.keras as hvd\n", "import hvdkeras as hvd\n"),
    ("import horovod.keras as hvd  # the old package\n",
     "import hvdkeras as hvd  # the old package\n"),
    ("import horovod.tensorflow as hvd\n", "import hvdkeras as hvd\n"),
    ("from horovod.tensorflow.keras import callbacks\n", "from hvdkeras import callbacks\n"),
    ("from horovod.keras.callbacks import MetricAverageCallback\n",
     "from hvdkeras.callbacks import MetricAverageCallback\n"),
    ("from tensorflow import keras\n", "import keras\n"),
    ("from tensorflow.keras import layers, models\n", "from keras import layers, models\n"),
    ("from tensorflow.keras.optimizers.legacy import Adam\n", "from keras.optimizers import Adam\n"),
    ("import tensorflow as tf\nm = tf.keras.Sequential()\n",
     "import tensorflow as tf\nimport keras\nm = keras.Sequential()\n"),
    ("import keras\nopt = keras.optimizers.legacy.SGD(lr=0.1, momentum=0.9)\n",
     "import keras\nopt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)\n"),
    ("model.compile(loss='mse', optimizer=opt,\n              experimental_run_tf_function=False)\n",
     "model.compile(loss='mse', optimizer=opt)\n"),
    ("model.compile(experimental_run_tf_function=False, loss='mse')\n",
     "model.compile(loss='mse')\n"),
    ("n = len(opt.variables())\n", "n = len(opt.variables)\n"),
    ("model.save_weights(\"w.h5\")\n", "model.save_weights(\"w.weights.h5\")\n"),
    ("cb = ModelCheckpoint('./checkpoint-{epoch}.h5')\n",
     "cb = ModelCheckpoint('./checkpoint-{epoch}.keras')\n"),
    ("cb = ModelCheckpoint(filepath='ck.ckpt', save_weights_only=True)\n",
     "cb = ModelCheckpoint(filepath='ck.weights.h5', save_weights_only=True)\n"),
    ("import hvdkeras as hvd\nmodel.save_weights(path)\n",
     "import hvdkeras as hvd\nmodel.save_weights(hvd.keras3_weights_path(path))\n"),
    ("import hvdkeras as hvd\ncb = ModelCheckpoint(os.path.join(d, 'ck-{epoch}.ckpt'), "
     "save_weights_only=True)\n",
     "import hvdkeras as hvd\ncb = ModelCheckpoint(hvd.keras3_weights_path(os.path.join(d, "
     "'ck-{epoch}.ckpt')), save_weights_only=True)\n"),
    ("import hvdkeras as hvd\nmodel.load_weights(f'{d}/ck-{e}.ckpt')\n",
     "import hvdkeras as hvd\nmodel.load_weights(hvd.keras3_weights_path(f'{d}/ck-{e}.ckpt'))\n"),
    ("model.fit_generator(gen, steps_per_epoch=5, workers=4, use_multiprocessing=True)\n",
     "model.fit(gen, steps_per_epoch=5)\n"),
    ("score = model.evaluate_generator(gen, steps=3)\n", "score = model.evaluate(gen, steps=3)\n"),
    ("model.save('export_dir')\n", "model.save('export_dir.keras')\n"),
    ("import hvdkeras as hvd\nself.model.save(out)\n",
     "import hvdkeras as hvd\nself.model.save(hvd.keras3_model_path(out))\n"),
    ("image.save(out)\nnp.save(out, x)\n", "image.save(out)\nnp.save(out, x)\n"),
])
def test_each_rule(before, after):
    assert _rewrite(before) == after


def test_plain_import_horovod_becomes_hvdkeras_under_that_name():
    """`horovod.run(...)` keeps working: hvdkeras has `run` with Horovod's arguments."""
    source = "import horovod\nimport horovod.tensorflow.keras as hvd\nhorovod.run(main, np=2)\n"
    result = migrate(source)
    assert result.text == ("import hvdkeras as horovod\nimport hvdkeras as hvd\n"
                           "horovod.run(main, np=2)\n")
    assert not result.notes


def test_what_cannot_be_changed_is_named_and_left_alone():
    source = textwrap.dedent("""\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd
        from tensorflow.keras import backend as K
        opt = hvd.PartialDistributedOptimizer(opt, local_layers=[dense])
        K.set_session(tf.compat.v1.Session())
        opt = tf.keras.optimizers.SGD(0.1, decay=1e-4)
        cb = tf.keras.callbacks.ModelCheckpoint(f"ck-{name}.h5")
        best = hvd.callbacks.BestModelCheckpoint(monitor="val_loss")
        hvd.broadcast_global_variables(0)
        """)
    result = migrate(source)
    compile(result.text, "<migrated>", "exec")
    notes = "\n".join(f"{line}: {what}" for line, what in result.notes)
    assert "PartialDistributedOptimizer" not in notes  # hvdkeras has it
    assert "5: K.set_session: Keras 3 has no sessions" in notes
    assert "5: tf.compat: TensorFlow 1 API" in notes
    assert "6: decay= is gone in Keras 3 optimizers" in notes
    assert 'hvd.callbacks.BestModelCheckpoint' in result.text
    assert 'ModelCheckpoint(hvd.keras3_model_path(f"ck-{name}.h5"))' in result.text
    assert "BestModelCheckpoint" not in notes  # hvdkeras has it
    assert "9: hvd.broadcast_global_variables: TensorFlow 1 graph code only" in notes
    assert "hvd.PartialDistributedOptimizer(" in result.text and "decay=1e-4" in result.text


def test_a_runtime_path_without_an_hvdkeras_import_is_reported():
    result = migrate("import tensorflow as tf\nmodel.save_weights(os.path.join(d, 'w.ckpt'))\n"
                     "latest = tf.train.latest_checkpoint(d)\n")
    notes = "\n".join(f"{line}: {what}" for line, what in result.notes)
    assert "2: save_weights() path is built at run time: make it end in .weights.h5" in notes
    assert "3: tf.train.latest_checkpoint: Keras 3 writes no TensorFlow checkpoints" in notes


def test_a_horovod_keras_script_end_to_end():
    source = textwrap.dedent("""\
        import tensorflow as tf
        import horovod.tensorflow.keras as hvd

        # Horovod: initialize Horovod.
        hvd.init()
        model = tf.keras.Sequential([
            tf.keras.layers.Dense(10, activation='softmax'),  # a comment stays
        ])
        opt = tf.keras.optimizers.legacy.Adam(lr=0.001 * hvd.size())
        opt = hvd.DistributedOptimizer(opt)
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                      metrics=['accuracy'], experimental_run_tf_function=False)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
        if hvd.rank() == 0:
            callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))
        """)
    result = migrate(source)
    compile(result.text, "<migrated>", "exec")
    assert result.text.splitlines()[:3] == ["import tensorflow as tf", "import keras",
                                            "import hvdkeras as hvd"]
    assert "# a comment stays" in result.text and "tf.keras" not in result.text
    assert "keras.optimizers.Adam(learning_rate=0.001 * hvd.size())" in result.text
    assert "experimental_run_tf_function" not in result.text
    assert "'./checkpoint-{epoch}.keras'" in result.text
    assert result.notes == []
    report = result.report("train.py")
    assert "train.py:2: import horovod.tensorflow.keras -> hvdkeras" in report
    assert report.endswith(f"{len(result.changes)} change(s), 0 place(s) left to you")
    assert len(result.changes) == 11


def test_the_command(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import horovod.tensorflow.keras as hvd\nhvd.init()\n")
    out = tmp_path / "migrated.py"
    hvdkeras = [sys.executable, "-m", "hvdkeras.cli", "migrate"]
    done = subprocess.run([*hvdkeras, str(script), "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "import hvdkeras as hvd\nhvd.init()\n"
    assert f"{script}:1: import horovod.tensorflow.keras -> hvdkeras" in done.stderr
    assert script.read_text().startswith("import horovod")  # the input is left as it was
    diff = subprocess.run([*hvdkeras, str(script), "--diff"], capture_output=True, text=True)
    assert "-import horovod.tensorflow.keras as hvd\n+import hvdkeras as hvd\n" in diff.stdout
    script.write_text("def broken(:\n")
    bad = subprocess.run([*hvdkeras, str(script)], capture_output=True, text=True)
    assert bad.returncode == 2 and f"{script}:1: not valid Python" in bad.stderr


KERAS2_SCRIPT = '''\
import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
out = sys.argv[1]
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                             tf.keras.layers.Dense(2, activation="softmax")])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(lr=0.01 * hvd.size()))
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt,
              experimental_run_tf_function=False)
checkpoint = os.path.join(out, "checkpoint-{epoch}.ckpt")
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True))


def batches():
    while True:
        for i in range(0, 64, 16):
            yield x[i:i + 16], y[i:i + 16]


model.fit_generator(batches(), steps_per_epoch=4, epochs=2, workers=2, verbose=0,
                    callbacks=callbacks)
model.load_weights(os.path.join(out, f"checkpoint-{2}.ckpt"))
model.save_weights(f"{out}/final.h5")
model.save(os.path.join(out, "exported"))
print("trained and saved")
'''


@pytest.mark.slow
@pytest.mark.light  # one process
@pytest.mark.timeout(300)
def test_a_migrated_keras2_script_with_runtime_paths_runs(tmp_path):
    """Horovod-era Keras 2 idioms that Keras 3 rejects at run time: checkpoint
    paths built with os.path.join and f-strings (.ckpt, .h5, a SavedModel
    directory), fit_generator with workers=, lr=: migrated, the script runs
    and writes the files Keras 3 names."""
    script = tmp_path / "train.py"
    script.write_text(KERAS2_SCRIPT)
    migrated = tmp_path / "train_keras3.py"
    result = subprocess.run([sys.executable, "-m", "hvdkeras.cli", "migrate", str(script),
                             "-o", str(migrated)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 place(s) left to you" in result.stdout + result.stderr
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run([sys.executable, str(migrated), str(out)], capture_output=True,
                         text=True, timeout=240, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "trained and saved" in run.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoint-1.weights.h5", "checkpoint-2.weights.h5", "exported.keras",
        "final.weights.h5"]
    assert "is written and read as" in run.stdout  # it says where the files went


TORCH_SCRIPT = """\
import torch
import horovod.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     backward_passes_per_step=2)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
handle = hvd.allreduce_async(torch.ones(2), name="x")
total = hvd.synchronize(handle)
"""


def test_a_horovod_torch_script_keeps_torch_names_and_hears_what_to_change():
    result = migrate(TORCH_SCRIPT)
    assert result.text == TORCH_SCRIPT.replace("import horovod.torch as hvd",
                                               "import hvdkeras as hvd")
    assert "lr=0.01" in result.text  # a torch optimizer's own keyword, not Keras 2's
    notes = " ".join(what for _, what in result.notes)
    assert "KERAS_BACKEND=torch" in notes
    assert "hvd.allreduce_async" in notes and "hvd.synchronize" in notes

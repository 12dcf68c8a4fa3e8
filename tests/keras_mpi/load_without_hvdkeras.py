"""Loads the files save_models.py wrote, in a process that never imports
hvdkeras, and checks optimizer classes, state, and that training goes on.

Usage: python load_without_hvdkeras.py OUTDIR
"""

import os
import sys

import keras
import numpy as np

import custom_optimizer  # noqa: F401  (the user's own class must be importable)
from saved_models import EXPECTED, data, state


def main(outdir):
    for name, (class_name, inner_name, _) in EXPECTED.items():
        model = keras.saving.load_model(os.path.join(outdir, f"{name}.keras"))
        assert type(model.optimizer).__name__ == class_name, (name, type(model.optimizer))
        if inner_name:
            assert type(model.optimizer.inner_optimizer).__name__ == inner_name
        expected = np.load(os.path.join(outdir, f"{name}.npz"))
        got = state(model)
        assert len(got) == len(expected.files), (name, len(got), len(expected.files))
        for i, value in enumerate(got):
            np.testing.assert_array_equal(value, expected[f"arr_{i}"])
        x, y = data(seed=0)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        print(f"{name}: loaded without hvdkeras ({type(model.optimizer).__name__}) and trained",
              flush=True)
    assert "hvdkeras" not in sys.modules, "hvdkeras was imported"
    print("hvdkeras never imported", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

"""Keras 2 checkpoint paths in Keras 3: the file names Keras 3 requires, for
paths a script builds at run time.

Keras 3 saves weights only to names ending in `.weights.h5` and models only
to `.keras` (or legacy `.h5`) files; Keras 2 scripts, Horovod's examples
among them, pass `checkpoint-{epoch}.ckpt`, `weights.h5` or a SavedModel
directory, often assembled with `os.path.join` or an f-string, which no
rewrite of the source text can fix. `hvdkeras migrate` wraps such paths in
`keras3_weights_path(...)` / `keras3_model_path(...)`, which map them at run
time, the same way for saving and for loading, and say once (rank 0) what
they map.

What may import this module: the top-level package.
"""

from __future__ import annotations

import os
from typing import Set, Union

from hvdkeras.training.output import print_rank0

WEIGHTS_SUFFIX = ".weights.h5"
MODEL_SUFFIX = ".keras"
# Endings Keras 2 scripts give checkpoints: replaced by Keras 3's.
_KERAS2_ENDINGS = (".weights.h5", ".h5", ".hdf5", ".ckpt", ".tf", ".keras", ".pb")
_said: Set[str] = set()


def keras3_path(path: Union[str, os.PathLike], weights_only: bool) -> str:
    """The Keras 3 name for a Keras 2 checkpoint path. Pure.

    Args:
        path: The path (format fields such as `{epoch:02d}` are kept).
        weights_only: A weights file (`.weights.h5`) rather than a whole
            model (`.keras`).

    Returns:
        `path` with its Keras 2 ending replaced (or, without one, extended);
        unchanged when it already ends as Keras 3 wants. A whole-model `.h5`
        path stays: Keras 3 still writes legacy HDF5 models.

    Example: `keras3_path("ckpt-{epoch}.ckpt", True) == "ckpt-{epoch}.weights.h5"`.
    """
    path = os.fspath(path)
    wanted = WEIGHTS_SUFFIX if weights_only else MODEL_SUFFIX
    if path.endswith(wanted) or (not weights_only and path.endswith(".h5")):
        return path
    stem = path.rstrip("/") if not weights_only else path
    for ending in _KERAS2_ENDINGS:
        if stem.endswith(ending):
            stem = stem[:-len(ending)]
            break
    return stem + wanted


def _mapped(path: Union[str, os.PathLike], weights_only: bool) -> str:
    new = keras3_path(path, weights_only)
    old = os.fspath(path)
    if new != old and old not in _said:
        _said.add(old)
        kind = "weights files end in .weights.h5" if weights_only else "models are .keras files"
        print_rank0(f"Keras 3 {kind}: {old!r} is written and read as {new!r}.")
    return new


def keras3_weights_path(path: Union[str, os.PathLike]) -> str:
    """A Keras 2 weights path as Keras 3 wants it (`.weights.h5`).

    For `model.save_weights(...)`, `model.load_weights(...)` and
    `ModelCheckpoint(..., save_weights_only=True)` with paths built at run
    time. Saving and loading map a path the same way, so a script that
    saves `ckpt-5.ckpt` and later loads `ckpt-5.ckpt` finds its file.

    Args:
        path: The Keras 2 path (a string or path-like).

    Returns:
        The path to use (see `keras3_path`).

    Example:

    ```python
    model.load_weights(hvd.keras3_weights_path(os.path.join(d, f"ckpt-{epoch}.ckpt")))
    ```
    """
    return _mapped(path, weights_only=True)


def keras3_model_path(path: Union[str, os.PathLike]) -> str:
    """A Keras 2 model path (a SavedModel directory, `.ckpt`, `.tf`) as a
    Keras 3 `.keras` file name; `.keras` and `.h5` paths are kept.

    Args:
        path: The Keras 2 path.

    Returns:
        The path to use (see `keras3_path`).

    Example:

    ```python
    model.save(hvd.keras3_model_path(os.path.join(out, "final_model")))
    ```
    """
    return _mapped(path, weights_only=False)

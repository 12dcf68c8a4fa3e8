"""Turning a DataFrame's columns into a Keras model's arrays, and sharing rows
out between ranks. Pure NumPy: tested without Spark or MPI.

What may import this module: the rest of `hvdkeras.spark`.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np


def column_array(values: Sequence, shape: Tuple, label: bool = False) -> np.ndarray:
    """One column's values (numbers, lists, arrays or Spark ML vectors) as an
    array of `(rows,) + shape` (the model input's or output's shape).

    A label column of one number per row stays `(rows,)` whatever the
    output's shape: a class index for a sparse loss.

    Raises:
        ValueError: when the values do not fit the shape.
    """
    rows = [v.toArray() if hasattr(v, "toArray") else v for v in values]
    array = np.asarray([np.asarray(r, dtype=np.float32) for r in rows], dtype=np.float32)
    want = tuple(d for d in shape if d is not None)
    per_row = int(np.prod(want)) if want else 1
    got = int(np.prod(array.shape[1:])) if array.ndim > 1 else 1
    if label and got == 1:
        return array.reshape(len(rows))
    if got != per_row:
        raise ValueError(f"a column holds {got} value(s) per row, but the model's layer "
                         f"expects shape {tuple(shape)} ({per_row} value(s)).")
    return array.reshape((len(rows),) + (want or ()))


def model_arrays(columns: Sequence[Sequence], shapes: Sequence[Tuple],
                 labels: bool = False) -> List[np.ndarray]:
    """`column_array` for each column, with the shape of the model input (or,
    with `labels`, output) it goes with."""
    if len(columns) != len(shapes):
        raise ValueError(f"{len(columns)} column(s) for a model with {len(shapes)} "
                         "input(s)/output(s); give one column per model input and output.")
    return [column_array(c, s, label=labels) for c, s in zip(columns, shapes)]


def rank_rows(rows: int, rank: int, size: int, batch_size: int) -> np.ndarray:
    """The row indices this rank trains on, batch by batch.

    Global batch s is rows [s*size*B, (s+1)*size*B) and this rank's part of it
    the B rows starting at s*size*B + rank*B, so without shuffling N ranks of
    batch B see exactly the batches of one process with batch N*B. Rows after
    the last whole global batch are left out: every rank runs the same steps.
    """
    steps = steps_per_epoch(rows, size, batch_size)
    starts = np.arange(steps) * size * batch_size + rank * batch_size
    return (starts[:, None] + np.arange(batch_size)[None, :]).reshape(-1)


def steps_per_epoch(rows: int, size: int, batch_size: int) -> int:
    """Steps each rank runs per epoch: the whole global batches of size*B rows.

    Raises:
        ValueError: when there is not one global batch.
    """
    if rows < size * batch_size:
        raise ValueError(f"{rows} rows are fewer than one global batch ({size} ranks x "
                         f"batch_size={batch_size}); use a smaller batch_size or num_proc.")
    return rows // (size * batch_size)

"""The KerasEstimator's pure data logic (hvdkeras/spark/keras_data.py): no Spark, no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from hvdkeras.spark.keras_data import column_array, model_arrays, rank_rows, steps_per_epoch


class FakeVector:
    """Stands in for a Spark ML vector: only its toArray() is used."""

    def __init__(self, values):
        self.values = values

    def toArray(self):
        return np.asarray(self.values, np.float64)


def test_columns_take_the_model_layers_shapes():
    flat = [list(range(784)), list(range(1, 785))]
    images = column_array(flat, (28, 28, 1))
    assert images.shape == (2, 28, 28, 1) and images.dtype == np.float32
    assert images[1, 0, 1, 0] == 2
    labels = column_array([3, 7], ())
    assert labels.shape == (2,) and list(labels) == [3, 7]
    classes = column_array([3, 7], (10,), label=True)  # a sparse loss's class indices
    assert classes.shape == (2,)
    vectors = column_array([FakeVector([0, 1]), FakeVector([1, 0])], (2,))
    np.testing.assert_array_equal(vectors, [[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="holds 3 value"):
        column_array([[1, 2, 3]], (4,))
    with pytest.raises(ValueError, match="one column per model input"):
        model_arrays([[1]], [(), ()])


def test_ranks_take_interleaved_batches():
    """Two ranks of batch 2 see the global batches of one process of batch 4."""
    assert steps_per_epoch(11, 2, 2) == 2
    rank0, rank1 = rank_rows(11, 0, 2, 2), rank_rows(11, 1, 2, 2)
    assert list(rank0) == [0, 1, 4, 5] and list(rank1) == [2, 3, 6, 7]
    assert list(rank_rows(11, 0, 1, 4)) == list(range(8))
    with pytest.raises(ValueError, match="fewer than one global batch"):
        steps_per_epoch(3, 2, 2)

"""The row-block planner for sharded optimizer state (Note [split variables]
in hvdkeras/sharding/split_plan.py): pure, no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from hvdkeras.sharding.plan import REPLICATED, SPLIT, plan_owners, shard_bytes
from hvdkeras.sharding.split_plan import Piece, piece_loads, plan_split

# The 96-512-384-10 MLP's variables (float32 bytes) and rows.
MLP_SIZES = [96 * 512 * 4, 512 * 4, 512 * 384 * 4, 384 * 4, 384 * 10 * 4, 10 * 4]
MLP_ROWS = [96, 512, 512, 384, 384, 10]


def test_the_docstring_example():
    assert plan_split([400, 40], [10, 10], 2, cuttable={0}, min_excess_bytes=0) == (
        [SPLIT, 1], {0: [Piece(0, 0, 6), Piece(1, 6, 10)]})


@pytest.mark.parametrize("world", [2, 3, 4, 8, 16])
def test_a_dominant_variable_is_cut_to_within_two_percent(world):
    whole = plan_owners(MLP_SIZES, world)
    assert max(shard_bytes(MLP_SIZES, whole, world)) > 0.7 * sum(MLP_SIZES)
    owners, pieces = plan_split(MLP_SIZES, MLP_ROWS, world, cuttable=set(range(6)))
    loads = piece_loads(MLP_SIZES, MLP_ROWS, owners, pieces, world)
    assert sum(loads) == sum(MLP_SIZES)
    assert max(loads) <= sum(MLP_SIZES) / world * 1.02
    assert len(pieces) <= world - 1
    for p, parts in pieces.items():  # contiguous, in rank order, covering every row
        assert owners[p] == SPLIT
        assert parts[0].begin == 0 and parts[-1].end == MLP_ROWS[p]
        assert all(a.end == b.begin and a.rank < b.rank for a, b in zip(parts, parts[1:]))


def test_small_models_are_left_whole():
    sizes, rows = [4000, 40], [100, 10]  # 1980 bytes over the ideal: not worth pieces
    assert plan_split(sizes, rows, 2, cuttable={0, 1}) == (plan_owners(sizes, 2), {})
    assert plan_split(sizes, rows, 2, cuttable={0, 1}, min_excess_bytes=1000)[1]


def test_balanced_whole_variables_are_left_whole():
    sizes = [100] * 8
    assert plan_split(sizes, [10] * 8, 4, cuttable=set(range(8))) == (plan_owners(sizes, 4), {})


def test_nothing_is_cut_without_leave():
    assert plan_split(MLP_SIZES, MLP_ROWS, 4) == (plan_owners(MLP_SIZES, 4), {})


def test_replicated_and_uncuttable_variables_stay_whole():
    owners, pieces = plan_split(MLP_SIZES, MLP_ROWS, 4, replicated={2}, cuttable={0, 2})
    assert owners[2] == REPLICATED and 2 not in pieces
    owners, pieces = plan_split(MLP_SIZES, MLP_ROWS, 4, cuttable={0, 1, 3, 4, 5})
    assert owners[2] != SPLIT and 2 not in pieces


def test_scalars_and_single_rows_are_never_cut():
    owners, pieces = plan_split([4000, 4], [1, 1], 2, cuttable={0, 1}, min_excess_bytes=0)
    assert pieces == {} and SPLIT not in owners


def test_the_plan_depends_on_its_inputs_alone():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 12))
        rows = [int(r) for r in rng.integers(1, 50, n)]
        sizes = [r * int(rng.integers(1, 9)) * 4 for r in rows]
        world = int(rng.integers(1, 9))
        cuttable = {i for i in range(n) if rng.random() < 0.7}
        first = plan_split(sizes, rows, world, cuttable=cuttable, min_excess_bytes=0)
        assert plan_split(list(sizes), list(rows), world, cuttable=set(cuttable),
                          min_excess_bytes=0) == first
        owners, pieces = first
        loads = piece_loads(sizes, rows, owners, pieces, world)
        assert sum(loads) == sum(sizes)
        assert max(loads) <= max(shard_bytes(sizes, plan_owners(sizes, world), world))
        for p, parts in pieces.items():
            assert p in cuttable and sum(x.end - x.begin for x in parts) == rows[p]


def test_which_optimizers_may_be_cut():
    import keras

    from hvdkeras import compat
    from hvdkeras.sharding.sharded_optimizer import ShardedOptimizerMixin, updates_elementwise

    class MyAdam(keras.optimizers.Adam):
        pass

    assert updates_elementwise(keras.optimizers.Adam(1e-3))
    assert updates_elementwise(keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=1.0))
    sharded = keras.optimizers.AdamW(1e-3)
    sharded.__class__ = compat.with_mixin(ShardedOptimizerMixin, type(sharded))
    assert updates_elementwise(sharded)
    assert not updates_elementwise(keras.optimizers.Adam(1e-3, clipnorm=1.0))
    assert not updates_elementwise(keras.optimizers.Lamb(1e-3))
    assert not updates_elementwise(keras.optimizers.Adafactor(1e-3))
    assert not updates_elementwise(MyAdam(1e-3))

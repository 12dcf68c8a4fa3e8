"""The sharding planner (pure): balanced, deterministic owners and the flat
block layout the step's collectives use. No MPI."""

import itertools

import pytest

from hvdkeras.sharding.plan import (REPLICATED, by_dtype, plan_blocks, plan_gather_groups,
                                    plan_owners, shard_bytes)


def test_largest_first_on_the_least_loaded_rank():
    assert plan_owners([8, 4, 4, 2], 2) == [0, 1, 1, 0]
    assert plan_owners([1, 1, 1], 4) == [0, 1, 2]  # rank 3 owns nothing


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 32])
def test_every_shard_within_the_ideal_plus_one_variable(world):
    sizes = [4 * (7 ** k % 1000 + 1) for k in range(200)]
    owners = plan_owners(sizes, world)
    loads = shard_bytes(sizes, owners, world)
    assert sum(loads) == sum(sizes)
    assert max(loads) <= sum(sizes) / world + max(sizes)
    assert plan_owners(list(sizes), world) == owners  # the same on every rank


def test_replicated_variables_belong_to_no_rank():
    owners = plan_owners([10, 20, 30], 2, replicated={1})
    assert owners[1] == REPLICATED and sorted(owners[::2]) == [0, 1]
    assert shard_bytes([10, 20, 30], owners, 2) in ([10, 30], [30, 10])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="world_size"):
        plan_owners([1], 0)
    with pytest.raises(ValueError, match="sizes"):
        plan_owners([-1], 2)


def test_blocks_follow_rank_order_and_pad_to_the_longest():
    blocks = plan_blocks([0, 1, 2], {0: 2, 1: 2, 2: 2}, [0, 1, 0], 2)
    assert blocks.members == [[0, 2], [1]]
    assert blocks.offsets == [[0, 2], [0]]
    assert blocks.lengths == [4, 2] and blocks.padded == 4


def test_blocks_cover_each_position_once():
    owners = [0, 1, 2, REPLICATED, 1, 0, 2]
    elements = {p: p + 1 for p in range(7)}
    blocks = plan_blocks(range(7), elements, owners, 3)
    listed = list(itertools.chain(*blocks.members))
    assert sorted(listed) == [0, 1, 2, 4, 5, 6]
    assert blocks.lengths == [sum(elements[p] for p in m) for m in blocks.members]


def test_by_dtype_keeps_first_appearance_order():
    dtypes = ["float32", "float16", "float32", "int32", "float16"]
    assert by_dtype([0, 1, 2, 3, 4], dtypes.__getitem__) == {
        "float32": [0, 2], "float16": [1, 4], "int32": [3]}
    assert list(by_dtype([4, 3], dtypes.__getitem__)) == ["float16", "int32"]
    assert by_dtype([], dtypes.__getitem__) == {}


def test_gather_groups_are_consecutive_runs_of_about_the_limit():
    sizes = {0: 5, 1: 5, 2: 20, 3: 5, 5: 3, 6: 3}
    assert plan_gather_groups([0, 1, 2, 3], sizes, 10) == [[0, 1], [2], [3]]
    groups = plan_gather_groups([0, 1, 2, 3, 5, 6], sizes, 10)
    assert list(itertools.chain(*groups)) == [0, 1, 2, 3, 5, 6]  # every position once, in order
    assert all(sum(sizes[p] for p in g) <= 10 or len(g) == 1 for g in groups)
    assert plan_gather_groups([], sizes, 10) == []
    assert plan_gather_groups([2], sizes, 10) == [[2]]

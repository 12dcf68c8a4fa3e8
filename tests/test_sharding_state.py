"""A sharded optimizer's bookkeeping (one process, no MPI): scratch
variables hvdkeras adds to an optimizer are marked as such and kept out of
saved files (Note [scratch variables are not state])."""

import keras
import numpy as np

from hvdkeras.sharding.sharded_optimizer import load_sharded, save_sharded
from hvdkeras.sharding.state import ShardState, slot_layout


def _built_adam():
    variables = [keras.Variable(np.ones((3, 2), "float32")),
                 keras.Variable(np.zeros(2, "float32"))]
    state = ShardState(rank=0, world_size=1, name="t", process_set=None, stage=1)
    built_for = state.plan(variables)
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(built_for)
    state.layout = slot_layout(optimizer, built_for)
    optimizer._hvdkeras_shards = state
    return optimizer, state


def test_scratch_is_marked_last_and_everywhere():
    optimizer, state = _built_adam()
    plain = len(optimizer.variables)
    sums = state.add_scratch(optimizer, [(3, 2), (2,)], ["float32", "float32"], "sum")
    count = state.add_scratch(optimizer, [()], ["int32"], "count")
    assert [id(v) for v in optimizer.variables[plain:]] == [id(v) for v in sums + count]
    assert [state.is_scratch(i) for i in range(len(optimizer.variables))] == \
        [False] * plain + [True] * 3
    for i in range(plain, plain + 3):
        assert state.is_everywhere(i) and not state.is_own_slot(i)
    assert tuple(sums[0].shape) == (3, 2) and float(keras.ops.sum(sums[0])) == 0.0
    state.check_layout(optimizer)  # scratch is no untied slot


def test_saved_files_hold_the_plain_optimizers_state_only():
    optimizer, state = _built_adam()
    plain = [keras.ops.convert_to_numpy(v) for v in optimizer.variables]
    sums = state.add_scratch(optimizer, [(3, 2), (2,)], ["float32", "float32"], "sum")
    sums[0].assign(np.full((3, 2), 5.0, "float32"))
    store = {}
    save_sharded(optimizer, optimizer.variables, store)
    assert len(store) == len(plain)
    for k, value in enumerate(plain):
        np.testing.assert_array_equal(store[str(k)], value)
    # Loading a plain file back leaves the scratch as it was.
    store["0"] = np.asarray(7, store["0"].dtype)
    assert load_sharded(optimizer, optimizer.variables, store)
    assert int(keras.ops.convert_to_numpy(optimizer.variables[0])) == 7
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(sums[0]), np.full((3, 2), 5.0))


def test_a_file_with_another_count_is_not_loaded():
    optimizer, state = _built_adam()
    state.add_scratch(optimizer, [(2,)], ["float32"], "sum")
    store = {str(k): keras.ops.convert_to_numpy(v) for k, v in enumerate(optimizer.variables)}
    assert not load_sharded(optimizer, optimizer.variables, store)  # scratch was saved too


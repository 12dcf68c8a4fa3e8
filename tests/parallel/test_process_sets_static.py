"""Process sets given to init(): lists of ranks and mpi4py communicators
(Horovod's static process sets). The test restarts hvdkeras with them."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdkeras as hvd
from parallel_helpers import WORLD_RANK, WORLD_SIZE, assert_exact


@pytest.mark.skipif(WORLD_SIZE < 2, reason="a proper process set needs 2+ ranks")
def test_sets_registered_at_init():
    hvd.shutdown()
    firsts = hvd.ProcessSet(range(WORLD_SIZE - 1))
    parity = MPI.COMM_WORLD.Split(color=WORLD_RANK % 2, key=WORLD_RANK)
    by_comm = hvd.ProcessSet(parity)
    try:
        hvd.init(process_sets=[firsts, by_comm, hvd.ProcessSet(range(WORLD_SIZE - 1))])
        mine = [r for r in range(WORLD_SIZE) if r % 2 == WORLD_RANK % 2]
        assert firsts.process_set_id is not None and firsts.size() == WORLD_SIZE - 1
        assert by_comm.ranks == mine and by_comm.rank() == mine.index(WORLD_RANK)
        got = hvd.allreduce(tf.constant([WORLD_RANK + 1]), op=hvd.Sum, name="by_comm",
                            process_set=by_comm)
        assert_exact(got, np.array([sum(r + 1 for r in mine)], np.int32))
        if firsts.included():
            total = hvd.allreduce(tf.constant([1]), op=hvd.Sum, name="firsts",
                                  process_set=firsts)
            assert_exact(total, np.array([WORLD_SIZE - 1], np.int32))
    finally:
        parity.Free()


def test_init_refuses_a_bad_process_sets_argument_before_starting():
    hvd.shutdown()
    with pytest.raises(ValueError, match="takes a list of hvdkeras.ProcessSet or 'dynamic'"):
        hvd.init(process_sets="static")
    with pytest.raises(ValueError, match="must list hvdkeras.ProcessSet objects"):
        hvd.init(process_sets=[[0, 1]])
    assert not hvd.is_initialized()
    hvd.init(process_sets="dynamic")  # Horovod's flag: sets can be added later
    assert hvd.is_initialized()

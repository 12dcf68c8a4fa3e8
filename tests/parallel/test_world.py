"""The world under Horovod's names: `size_op`/`rank_op`/... as tensors, and
what hvdkeras was built with (`mpi_built`, `nccl_built`, ...).

Runs under mpiexec (see tests/test_collectives_mpi.py) with 1, 2 and 3 ranks.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.engine import c_api, library
from parallel_helpers import MODES, WORLD_RANK, WORLD_SIZE, run


@pytest.mark.parametrize("mode", MODES)
def test_world_ops_hold_this_ranks_values(mode):
    ops = (hvd.size_op, hvd.rank_op, hvd.local_size_op, hvd.local_rank_op, hvd.cross_size_op,
           hvd.cross_rank_op)
    got = run(mode, lambda: tuple(op() for op in ops))
    assert [int(t.numpy()) for t in got] == [
        WORLD_SIZE, WORLD_RANK, hvd.local_size(), hvd.local_rank(), hvd.cross_size(),
        hvd.cross_rank()]
    assert all(t.dtype == tf.int32 and t.shape == () for t in got)


def test_size_op_of_a_process_set():
    assert int(hvd.size_op(process_set_id=0).numpy()) == WORLD_SIZE
    with pytest.raises(ValueError, match="Process set 99 is not registered"):
        hvd.size_op(process_set_id=99)


def test_built_with():
    assert hvd.mpi_built() and hvd.mpi_enabled()
    gpu_part = c_api.build_flavor(library.handle()) != "cpu"
    assert hvd.nccl_built() is gpu_part and hvd.cuda_built() is gpu_part
    assert not any(f() for f in (hvd.gloo_built, hvd.gloo_enabled, hvd.ccl_built, hvd.rocm_built,
                                 hvd.ddl_built, hvd.mlsl_built))

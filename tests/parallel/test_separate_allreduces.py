"""Separate allreduces of one tf.function run in one kernel (Note [separate
allreduces in one kernel] in ops/tf/separate_allreduces.cc): which ones the
graph pass merges, and that results and cross-rank matching are unchanged.

Runs under mpiexec (see tests/test_collectives_mpi.py). The merged graph is
read back from TensorFlow's run metadata: the partition graphs that ran.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, List, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

import hvdkeras as hvd
from hvdkeras.collectives.common import fixed_collective_names
from hvdkeras.engine import config
from parallel_helpers import WORLD_RANK, WORLD_SIZE, assert_exact

RANKS_SUM = WORLD_SIZE * (WORLD_SIZE + 1) // 2


def allreduce_nodes(fn, *args) -> Tuple[object, List[Tuple[str, List[str]]]]:
    """(fn's result, [(node name, its tensor_names)] for every allreduce node
    of the function graphs made for this call)."""
    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        result = fn(*args)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    nodes = [(node.name, [s.decode() for s in node.attr["tensor_names"].list.s])
             for graphs in metadata.function_graphs for graph in graphs.partition_graphs
             for node in graph.node if node.op == "HvdkerasAllreduce"
             and node.name != "HvdkerasAllreduce"]  # eager ops run as one-node functions
    return result, nodes


def merged_sets(nodes) -> List[set]:
    return sorted((set(names) for _, names in nodes if names), key=sorted)


def value(k: int, dtype=tf.float32) -> tf.Tensor:
    return tf.cast(tf.fill([3], WORLD_RANK + 1 + k), dtype)


@contextlib.contextmanager
def merging_off() -> Iterator[None]:
    os.environ[config.MERGE_SEPARATE_ALLREDUCES] = "0"
    try:
        yield
    finally:
        del os.environ[config.MERGE_SEPARATE_ALLREDUCES]


def test_independent_allreduces_merge_by_dtype_and_reduction():
    @tf.function
    def step():
        sums = [hvd.allreduce(value(k), op=hvd.Sum, name=f"indep_f{k}") for k in range(6)]
        ints = [hvd.allreduce(value(k, tf.int32), op=hvd.Sum, name=f"indep_i{k}")
                for k in range(4)]
        means = [hvd.allreduce(value(k) * 2.0, op=hvd.Average, name=f"indep_a{k}")
                 for k in range(3)]
        return sums, ints, means

    (sums, ints, means), nodes = allreduce_nodes(step)
    for k, got in enumerate(sums):
        assert_exact(got, np.full(3, RANKS_SUM + WORLD_SIZE * k, np.float32), f"sum {k}")
    for k, got in enumerate(ints):
        assert_exact(got, np.full(3, RANKS_SUM + WORLD_SIZE * k, np.int32), f"int {k}")
    for k, got in enumerate(means):
        assert_exact(got, np.full(3, 2.0 * (RANKS_SUM + WORLD_SIZE * k) / WORLD_SIZE,
                                  np.float32), f"mean {k}")
    assert merged_sets(nodes) == sorted(
        [{f"indep_f{k}" for k in range(6)}, {f"indep_i{k}" for k in range(4)},
         {f"indep_a{k}" for k in range(3)}], key=sorted), nodes
    assert len(nodes) == 3, nodes  # no one-tensor allreduce left


def test_an_allreduce_that_needs_another_is_not_merged_with_it():
    @tf.function
    def step():
        first = hvd.allreduce(value(0), op=hvd.Sum, name="chain_a")
        beside = hvd.allreduce(value(1), op=hvd.Sum, name="chain_c")
        second = hvd.allreduce(first + 1.0, op=hvd.Sum, name="chain_b")
        return first, beside, second

    (first, beside, second), nodes = allreduce_nodes(step)
    assert_exact(first, np.full(3, RANKS_SUM, np.float32))
    assert_exact(beside, np.full(3, RANKS_SUM + WORLD_SIZE, np.float32))
    assert_exact(second, np.full(3, WORLD_SIZE * (RANKS_SUM + 1), np.float32))
    assert merged_sets(nodes) == [{"chain_a", "chain_c"}], nodes
    assert "chain_b" in [name for name, _ in nodes], nodes


def test_ranks_whose_graphs_merge_differently_still_match():
    """Rank 0 makes the second allreduce wait for the first; the other ranks
    do not, so their pass merges both and rank 0's cannot. Each tensor is
    still negotiated under its own name, so the ranks agree."""
    @tf.function
    def step():
        a = hvd.allreduce(value(0), op=hvd.Sum, name="differ_a")
        b_input = value(1) + (a * 0.0 if WORLD_RANK == 0 else 0.0)
        b = hvd.allreduce(b_input, op=hvd.Sum, name="differ_b")
        return a, b

    (a, b), nodes = allreduce_nodes(step)  # the graphs are reported when first run
    assert merged_sets(nodes) == ([] if WORLD_RANK == 0 else [{"differ_a", "differ_b"}]), nodes
    for _ in range(3):
        assert_exact(a, np.full(3, RANKS_SUM, np.float32))
        assert_exact(b, np.full(3, RANKS_SUM + WORLD_SIZE, np.float32))
        a, b = step()


def test_merged_allreduces_whose_results_a_rank_ignores_still_run():
    """The other ranks ignore both results, so only the function's control
    outputs keep them: the merge must keep them too, or rank 0 would wait."""
    @tf.function
    def step():
        a = hvd.allreduce(value(0), op=hvd.Sum, name="ignored_a")
        b = hvd.allreduce(value(1), op=hvd.Sum, name="ignored_b")
        return (a, b) if WORLD_RANK == 0 else (value(0), value(1))

    (a, b), nodes = allreduce_nodes(step)
    if WORLD_RANK == 0:
        assert_exact(a, np.full(3, RANKS_SUM, np.float32))
        assert_exact(b, np.full(3, RANKS_SUM + WORLD_SIZE, np.float32))
    assert merged_sets(nodes) == [{"ignored_a", "ignored_b"}], nodes
    after = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after_ignored_merge")
    assert_exact(after, np.array([float(WORLD_SIZE)], np.float32))


def test_fixed_names_and_grouped_allreduces_are_left_alone():
    @tf.function
    def step():
        with fixed_collective_names():
            fixed = [hvd.allreduce(value(k), op=hvd.Sum, name=f"fixed_{k}") for k in range(2)]
        grouped = hvd.grouped_allreduce([value(2), value(3)], op=hvd.Sum, name="left_grouped")
        return fixed, grouped

    (fixed, grouped), nodes = allreduce_nodes(step)
    for k, got in enumerate(fixed + list(grouped)):
        assert_exact(got, np.full(3, RANKS_SUM + WORLD_SIZE * k, np.float32), f"tensor {k}")
    assert merged_sets(nodes) == [], nodes
    assert len(nodes) == 3, nodes


def test_the_pass_turns_off_with_its_variable():
    @tf.function
    def step():
        return [hvd.allreduce(value(k), op=hvd.Sum, name=f"off_{k}") for k in range(3)]

    with merging_off():
        got, nodes = allreduce_nodes(step)
    for k, g in enumerate(got):
        assert_exact(g, np.full(3, RANKS_SUM + WORLD_SIZE * k, np.float32), f"tensor {k}")
    assert merged_sets(nodes) == [] and len(nodes) == 3, nodes

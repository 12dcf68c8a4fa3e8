"""Gradients of allreduce and broadcast, checked against their definitions.

Runs under mpiexec (see tests/test_collectives_mpi.py).

Convention (Horovod's): each rank r differentiates its own loss
L_r = sum(c_r * y), where y is the collective's output and c_r an upstream
gradient that differs per rank. The gradient a rank receives for its input is
the derivative of the *global* loss sum_s L_s with respect to that input:

* y = post * sum_s(pre * x_s)           ->  dL/dx_r = pre * post * sum_s c_s
* y = post * sum_s(pre * x_s) / size    ->  dL/dx_r = pre * post * sum_s c_s / size
* y = x_root (broadcast)                ->  dL/dx_root = sum_s c_s, zeros elsewhere

All values are small integers or halves, so the checks are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import MODES, ROOTS, WORLD_RANK, WORLD_SIZE, assert_exact

SHAPE = (2, 3)
SCALES = [(1.0, 1.0), (0.5, 1.0), (1.0, 4.0), (0.5, 4.0)]


def x_of(rank: int) -> np.ndarray:
    """Rank r's input x_r."""
    return (np.arange(6).reshape(SHAPE) % 4 + 2 * rank).astype(np.float64)


def c_of(rank: int) -> np.ndarray:
    """Rank r's upstream gradient c_r (the weights of its loss)."""
    return (np.arange(6).reshape(SHAPE) % 3 + rank + 1).astype(np.float64)


def sum_over_ranks(fn) -> np.ndarray:
    return np.sum([fn(r) for r in range(WORLD_SIZE)], axis=0)


def run_with_tape(mode: str, body, *args):
    """Runs `body(tape, *args)` inside a GradientTape, eagerly or in a tf.function."""
    def wrapped(*a):
        with tf.GradientTape(persistent=True) as tape:
            return body(tape, *a)
    if mode == "function":
        wrapped = tf.function(wrapped)
    return wrapped(*args)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prescale,postscale", SCALES)
@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average), ids=("Sum", "Average"))
def test_allreduce_gradient(op, prescale, postscale, mode):
    """d(sum_s L_s)/dx_r = pre * post * reduce_op(c_s), for Sum and Average."""
    x = tf.constant(x_of(WORLD_RANK))
    c = tf.constant(c_of(WORLD_RANK))

    def body(tape, x, c):
        tape.watch(x)
        y = hvd.allreduce(x, op=op, prescale_factor=prescale, postscale_factor=postscale,
                          name="grad_y")
        loss = tf.reduce_sum(c * y)
        return y, tape.gradient(loss, x)

    y, dx = run_with_tape(mode, body, x, c)
    divisor = WORLD_SIZE if op == hvd.Average else 1
    assert_exact(y, prescale * postscale * sum_over_ranks(x_of) / divisor, "forward")
    assert_exact(dx, prescale * postscale * sum_over_ranks(c_of) / divisor, "gradient")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average), ids=("Sum", "Average"))
def test_allreduce_gradient_through_a_product(op, mode):
    """y = allreduce(x_r * w): dL_r/dw = sum_i x_r[i] * g[i] with g the reduced upstream grads.

    The chain rule runs through the collective: each rank's w gradient mixes
    its own x_r with every rank's upstream gradient.
    """
    w = tf.Variable(3.0, dtype=tf.float64)
    x = tf.constant(x_of(WORLD_RANK))
    c = tf.constant(c_of(WORLD_RANK))

    def body(tape, x, c):
        y = hvd.allreduce(x * w, op=op, prescale_factor=0.5, postscale_factor=4.0)
        return tape.gradient(tf.reduce_sum(c * y), w)

    dw = run_with_tape(mode, body, x, c)
    divisor = WORLD_SIZE if op == hvd.Average else 1
    g = 0.5 * 4.0 * sum_over_ranks(c_of) / divisor
    assert_exact(dw, np.float64(np.sum(x_of(WORLD_RANK) * g)))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_gradient(mode):
    """Each tensor of a group gets the reduced gradient of its own output."""
    x1 = tf.constant(x_of(WORLD_RANK))
    x2 = tf.constant(x_of(WORLD_RANK)[0] * 2)

    def body(tape, x1, x2):
        tape.watch([x1, x2])
        y1, y2 = hvd.grouped_allreduce([x1, x2], op=hvd.Sum)
        loss = (tf.reduce_sum(tf.constant(c_of(WORLD_RANK)) * y1)
                + (WORLD_RANK + 1) * tf.reduce_sum(y2))
        return tape.gradient(loss, [x1, x2])

    d1, d2 = run_with_tape(mode, body, x1, x2)
    assert_exact(d1, sum_over_ranks(c_of))
    assert_exact(d2, np.full((3,), float(sum(r + 1 for r in range(WORLD_SIZE)))))


@pytest.mark.parametrize("op", (hvd.Min, hvd.Max, hvd.Product), ids=("Min", "Max", "Product"))
def test_no_gradient_for_min_max_product(op):
    """Only Sum and Average are differentiable: asking for more is an error, not zeros."""
    x = tf.constant(x_of(WORLD_RANK))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=op)
    with pytest.raises(NotImplementedError, match="only Sum and Average"):
        tape.gradient(y, x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_gradient(root, mode):
    """The root gets the sum over ranks of the upstream gradients; other ranks get zeros."""
    x = tf.constant(x_of(WORLD_RANK))
    c = tf.constant(c_of(WORLD_RANK))

    def body(tape, x, c):
        tape.watch(x)
        y = hvd.broadcast(x, root_rank=root, name="grad_b")
        return y, tape.gradient(tf.reduce_sum(c * y), x)

    y, dx = run_with_tape(mode, body, x, c)
    assert_exact(y, x_of(root), "forward")
    want = sum_over_ranks(c_of) if WORLD_RANK == root else np.zeros(SHAPE)
    assert_exact(dx, want, "gradient")


def test_keras_style_training_step_keeps_replicas_in_sync():
    """Averaged gradients applied to broadcast weights keep every replica identical."""
    w = tf.Variable(np.full((3,), 10.0 + WORLD_RANK))  # deliberately out of sync
    hvd.broadcast_variables([w], root_rank=0)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * x)
        (g,) = tape.gradient(loss, [w])
        g = hvd.allreduce(g, op=hvd.Average, name="avg_grad")
        w.assign_sub(0.5 * g)
        return g

    for k in range(3):
        x = tf.constant(np.full((3,), float(2 * (WORLD_RANK + k))))  # local gradient == x
        step(x)
    avg = [np.mean([2 * (r + k) for r in range(WORLD_SIZE)]) for k in range(3)]
    assert_exact(w, np.full((3,), 10.0) - 0.5 * np.sum(avg))
    gathered = hvd.allreduce(w, op=hvd.Max) - hvd.allreduce(w, op=hvd.Min)
    assert_exact(gathered, np.zeros(3))

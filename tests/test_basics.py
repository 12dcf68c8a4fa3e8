"""hvdkeras without mpiexec: before init(), and a plain script as a world of one.

Each check runs in a fresh interpreter (no mpiexec), so the outer pytest
process never initializes MPI or starts the engine itself.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from mpi_runner import describe, run_python

# Each job here is one process (the `light` marker: pyproject.toml).
pytestmark = pytest.mark.light

TIMEOUT_S = 180


def run_script(source: str) -> dict:
    """Runs `source` in a plain `python -c`; it prints one JSON line prefixed with RESULT."""
    result = run_python(["-c", textwrap.dedent(source)], timeout=TIMEOUT_S)
    assert result.returncode == 0, describe(result)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, describe(result)
    return json.loads(lines[0][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_queries_before_init_raise_value_error():
    """size(), rank() and the other world queries raise ValueError (naming init()) before init()."""
    out = run_script("""
        import json
        import hvdkeras as hvd
        out = {"initialized": hvd.is_initialized()}
        for name in ("size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
                     "is_homogeneous", "mpi_threads_supported", "engine_config"):
            try:
                out[name] = ["returned", repr(getattr(hvd, name)())]
            except ValueError as e:
                out[name] = ["ValueError", str(e)]
        try:
            hvd.allreduce([1.0])
            out["allreduce"] = ["returned", None]
        except ValueError as e:
            out["allreduce"] = ["ValueError", str(e)]
        print("RESULT " + json.dumps(out))
    """)
    assert out.pop("initialized") is False
    for name, (kind, message) in out.items():
        assert kind == "ValueError", f"{name}() before init() {kind}: {message}"
        assert "init()" in message, f"{name}(): {message}"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_plain_script_is_a_world_of_one():
    """Without mpiexec: size 1, rank 0, and every collective returns its input."""
    out = run_script("""
        import json
        import numpy as np
        import tensorflow as tf
        import hvdkeras as hvd
        hvd.init()
        x = tf.constant([[1.5, -2.0], [3.0, 0.25]])
        out = {
            "size": hvd.size(), "rank": hvd.rank(),
            "local_size": hvd.local_size(), "local_rank": hvd.local_rank(),
            "default": hvd.allreduce(x).numpy().tolist(),
            "sum": hvd.allreduce(x, op=hvd.Sum).numpy().tolist(),
            "average": hvd.allreduce(x, op=hvd.Average).numpy().tolist(),
            "int_average": hvd.allreduce(tf.constant([7, -7]), op=hvd.Average).numpy().tolist(),
            "scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5,
                                    postscale_factor=4.0).numpy().tolist(),
            "function": tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))(x).numpy().tolist(),
            "broadcast": hvd.broadcast(x, root_rank=0).numpy().tolist(),
            "grouped": [t.numpy().tolist() for t in hvd.grouped_allreduce(
                [x, tf.constant([1, 2])], op=hvd.Sum)],
        }
        hvd.shutdown()
        out["initialized_after_shutdown"] = hvd.is_initialized()
        print("RESULT " + json.dumps(out))
    """)
    x = [[1.5, -2.0], [3.0, 0.25]]
    assert (out["size"], out["rank"], out["local_size"], out["local_rank"]) == (1, 0, 1, 0)
    for key in ("default", "sum", "average", "function", "broadcast"):
        assert out[key] == x, key
    assert out["int_average"] == [7, -7]
    assert out["scaled"] == [[2 * v for v in row] for row in x]
    assert out["grouped"] == [x, [1, 2]]
    assert out["initialized_after_shutdown"] is False


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_raw_op_before_init_fails_with_a_clear_error():
    """The engine itself refuses work before init() (FailedPreconditionError naming init())."""
    out = run_script("""
        import json
        import tensorflow as tf
        from hvdkeras.engine import library
        try:
            library.ops().hvdkeras_allreduce([tf.ones([2])], reduce_op=1, tensor_name="early")
            out = {"kind": "returned", "message": ""}
        except tf.errors.FailedPreconditionError as e:
            out = {"kind": "FailedPreconditionError", "message": e.message}
        print("RESULT " + json.dumps(out))
    """)
    assert out["kind"] == "FailedPreconditionError", out
    assert ("hvdkeras has not been initialized: call hvdkeras.init() before running "
            "collective 'early'.") in out["message"]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_horovod_knob_names_reach_the_engine_and_ours_win():
    """HOROVOD_* knobs work as aliases; where both are set ours wins and init says so once."""
    source = textwrap.dedent("""
        import json
        import hvdkeras as hvd
        hvd.init()
        config = hvd.engine_config()
        print("RESULT " + json.dumps({"cycle": config.cycle_time_ms,
                                      "cache": config.cache_capacity}))
    """)
    result = run_python(["-c", source], timeout=TIMEOUT_S,
                        env={"HOROVOD_CYCLE_TIME": "4.5", "HOROVOD_CACHE_CAPACITY": "9",
                             "HVDKERAS_CACHE_CAPACITY": "17"})
    assert result.returncode == 0, describe(result)
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):]) == {"cycle": 4.5, "cache": 17}
    assert result.stdout.count(
        "hvdkeras: HOROVOD_CACHE_CAPACITY='9' is ignored: HVDKERAS_CACHE_CAPACITY='17' is set") == 1

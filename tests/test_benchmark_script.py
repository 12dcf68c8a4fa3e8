"""The allreduce benchmark script runs and prints its whole table.

Timing is the script's business, not the tests': this only checks that
`examples/allreduce_benchmark.py` still works end to end under 2 ranks (a
short run: one size, few iterations, one pass), in both shapes of its cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "allreduce_benchmark.py"
TIMEOUT = 240
CASES = ["raw mpi4py Allreduce", "(a) one tensor", "(b) grouped x100", "(c) separate x100"]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("extra", [[], ["--boundary"]], ids=["in-graph", "boundary"])
def test_benchmark_prints_every_case(extra):
    # 50 pairs, not the default 2000: the distribution's line, not its numbers.
    result = run_under_mpi(2, [str(SCRIPT), "--sizes", "4KB,256KB", "--scale", "0.05",
                               "--repeat", "1", "--pairs", "50", *extra], timeout=TIMEOUT)
    assert result.returncode == 0, describe(result)
    def table(out: str) -> list:
        return [line.split() for line in out.splitlines()
                if line.strip().startswith(("4KB", "256KB"))]

    rows = table(result.ranks[0].stdout)
    assert table(result.ranks[1].stdout) == [], result.stdout  # rank 0 alone prints
    for size in ("4KB", "256KB"):
        for case in CASES:
            matching = [r for r in rows if r[0] == size and " ".join(r[1:]).startswith(case)]
            assert len(matching) == 1, (size, case, result.stdout)
    # Every timing is a positive number of milliseconds.
    for row in rows:
        median_ms = float(row[-5] if row[1] != "raw" else row[-3])
        assert median_ms > 0, row
    spread = [line for line in result.ranks[0].stdout.splitlines()
              if line.startswith("(c) separate x100 at 4KB, ms above TF alone per step over 50")]
    assert len(spread) == 1 and all(f"p{q} " in spread[0] for q in (10, 25, 50, 75, 90)), \
        result.ranks[0].stdout


SYNTHETIC = SCRIPT.parent / "synthetic_benchmark.py"
TINY = ["--model", "MobileNetV2", "--image-size", "32", "--batch-size", "4",
        "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2"]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_synthetic_benchmark_prints_horovods_lines():
    """examples/synthetic_benchmark.py through model.fit on 2 ranks: per-iteration
    and summary lines, on rank 0 alone."""
    result = run_under_mpi(2, [str(SYNTHETIC), *TINY], timeout=TIMEOUT)
    assert result.returncode == 0, describe(result)
    out = result.ranks[0].stdout
    assert out.count("Iter #") == 2 and "Img/sec per rank:" in out, out
    assert "Total img/sec on 2 rank(s):" in out, out
    assert "img/sec" not in result.ranks[1].stdout


def test_timeline_breakdown_unions_the_top_level_events(tmp_path):
    """Pure: the synthetic benchmark's reading of a trace (nested phases are
    inside their op; overlapping ops count once)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic_benchmark", SYNTHETIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    events = [
        {"ph": "B", "pid": 1, "ts": 0, "name": "NEGOTIATE_ALLREDUCE"}, {"ph": "E", "pid": 1, "ts": 1000},
        {"ph": "B", "pid": 1, "ts": 1000, "name": "ALLREDUCE"},
        {"ph": "B", "pid": 1, "ts": 1100, "name": "MPI_ALLREDUCE"}, {"ph": "E", "pid": 1, "ts": 1500},
        {"ph": "E", "pid": 1, "ts": 2000},
        {"ph": "B", "pid": 2, "ts": 1500, "name": "ALLREDUCE"}, {"ph": "E", "pid": 2, "ts": 2500},
    ]
    path = tmp_path / "t.json"
    path.write_text(__import__("json").dumps(events))
    got = module.timeline_breakdown(str(path))
    assert got == {"negotiate_ms": 1.0, "execute_ms": 1.5, "busy_ms": 2.5, "span_ms": 2.5}


def test_timeline_overlap_finds_reductions_started_before_the_last_group(tmp_path):
    """Pure: two gradient groups over two steps; in the first step group 1's
    reduction starts 3 ms before group 0 (the first layers) is submitted, in
    the second step only after it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("synthetic_benchmark", SYNTHETIC)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def op(pid, submitted, started, ended):
        return [{"ph": "B", "pid": pid, "ts": submitted, "name": "NEGOTIATE_ALLREDUCE"},
                {"ph": "E", "pid": pid, "ts": started},
                {"ph": "B", "pid": pid, "ts": started, "name": "ALLREDUCE"},
                {"ph": "B", "pid": pid, "ts": started + 10, "name": "SHM_ALLREDUCE"},
                {"ph": "E", "pid": pid, "ts": ended - 10}, {"ph": "E", "pid": pid, "ts": ended}]

    names = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
             for pid, name in ((1, "call/sgd_gradients_0"), (2, "call/sgd_gradients_1"),
                               (3, "metrics_sum"))]
    events = (names + op(2, 0, 1000, 2000) + op(1, 4000, 4500, 6000) + op(3, 0, 10, 20)
              + op(2, 10000, 10500, 11000) + op(1, 10200, 11000, 12000))
    path = tmp_path / "t.json"
    path.write_text(__import__("json").dumps(events))
    got = module.timeline_overlap(str(path))
    assert got["groups"] == 2
    assert got["overlapped"] == 0.5
    assert got["lead_ms"] == pytest.approx((3.0 + -0.3) / 2)


def _example(name: str):
    import importlib.util
    import sys
    sys.path.insert(0, str(SCRIPT.parent))  # the examples import their neighbours
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lab_mode_arithmetic_and_worker_arguments():
    """Pure parts of the synthetic benchmark's lab mode (examples/lab_steps.py)."""
    lab = _example("lab_steps")
    assert lab.link_ms(125_000_000, 2, 1.0) == pytest.approx(1000.0)
    assert lab.link_ms(125_000_000, 4, 2.0) == pytest.approx(750.0)
    synthetic = _example("synthetic_benchmark")
    args = synthetic.parse_args(["--lab", "x", "--image-size", "64", "--batch-size", "8",
                                 "--fp16-allreduce"])
    worker = synthetic.lab_passthrough(args)
    assert worker[:4] == ["--image-size", "64", "--batch-size", "8"]
    assert "--skip-floor" in worker and "--fp16-allreduce" in worker and "--lab" not in worker
    parsed = synthetic.parse_args(worker + ["--model", "ResNet50"])
    assert (parsed.image_size, parsed.batch_size, parsed.skip_floor, parsed.lab) == (64, 8, True, "")


def test_ddp_peer_is_a_resnet50():
    """The DDP peer's network has ResNet-50's 25,557,032 parameters (the
    layout's published count; keras.applications adds conv biases: 0.1% more)."""
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    model = _example("ddp_peer").resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 1000)

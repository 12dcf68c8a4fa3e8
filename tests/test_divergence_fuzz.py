"""The divergence fuzzer: seeded programs whose ranks fall out of step must end.

Each program (tests/fuzz/programs.py) mixes every kind of collective in
eager, `tf.function` and `tf.compat.v1` graph-session modes; one or more
ranks diverge at one step (a skipped, extra or swapped collective, another
shape, dtype, kind or name, an exception caught and ignored, an early clean
exit, a sleep past the stall bound, an early join). Jobs of several programs
run under mpiexec (tests/fuzz/rank_program.py); after every program the
ranks meet again. The checks, program by program:

* every rank ended every program (no rank hangs: a job that runs past its
  timeout fails the test with every rank's output);
* no step waited longer than two stall bounds plus a margin (a sparse
  allreduce is two collectives in a row);
* a program without divergence ran every step with exact results, and the
  steps before a divergence did too;
* a divergence that cannot succeed left an error on some rank;
* the engine still works afterwards: the ranks' resync allreduce gives the
  world size (or, after a rank left, every rank ended cleanly).

The default run covers every divergence kind at 2 and 3 ranks;
HVDKERAS_FUZZ_PROGRAMS=N (e.g. 500) runs N random programs instead, and
prints the summary (programs, hangs, slowest time to error).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from mpi_runner import describe, run_under_mpi

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import programs  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "fuzz" / "rank_program.py"
STALL_S = 3.0
SLEEP_S = STALL_S + 1.5
MARGIN_S = 6.0          # scheduling on a loaded 2-core machine, graph building
PER_BATCH = 8
STARTUP_S = 120.0       # TensorFlow's import and hvdkeras.init() on every rank
LONG_RUN = int(os.environ.get("HVDKERAS_FUZZ_PROGRAMS", "0") or 0)

pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow]


def program_bound(program: programs.Program) -> float:
    """The most one program may take on a rank: every step a double stall,
    the sleep, the resync's attempts."""
    steps = len(program.steps) + 1
    return steps * (2 * STALL_S + 2.0) + SLEEP_S + 5 * STALL_S + MARGIN_S


def run_batch(size: int, batch: List[programs.Program], tmp_path: Path) -> Dict[int, List[dict]]:
    """Runs one job; returns rank -> its program records, in order."""
    timeout = STARTUP_S + sum(program_bound(p) for p in batch)
    result = run_under_mpi(
        size, [str(SCRIPT), str(tmp_path), *[programs.spec(p) for p in batch]],
        timeout=timeout,
        env={"HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_S), "FUZZ_SLEEP_SECONDS": str(SLEEP_S)})
    records = {}
    for r in range(size):
        path = tmp_path / f"rank{r}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records[r] = [json.loads(line) for line in lines]
    left = any(programs.ends_job(p) for p in batch)
    assert result.returncode == 0 or left, describe(result)
    return records


def check_program(program: programs.Program, by_rank: Dict[int, dict]) -> List[str]:
    """What is wrong with one program's records (empty: nothing)."""
    problems = []
    exits = program.divergence == "exit"
    for rank in range(program.size):
        record = by_rank.get(rank)
        leaves = exits and rank in program.ranks
        if record is None or not (record.get("done") or (leaves and record.get("exited"))):
            problems.append(f"rank {rank} did not end the program: {record}")
            continue
        for step in record["steps"]:
            limit = (len(program.steps) + 1) * (2 * STALL_S + 2) if step.get("join") else (
                2 * STALL_S + MARGIN_S)
            if step["seconds"] > limit:
                problems.append(f"rank {rank} waited {step['seconds']:.1f} s > {limit} s: {step}")
            before = program.divergence is None or step.get("i", 99) < program.at
            if before and ("error" in step or "wrong" in step) and not step.get("join"):
                problems.append(f"rank {rank} failed before any divergence: {step}")
            if "wrong" in step and program.divergence is None:
                problems.append(f"rank {rank} got a wrong result: {step}")
        if not leaves and not exits and not record["sync"]["ok"]:
            problems.append(f"rank {rank}: the engine did not work afterwards: {record['sync']}")
    errors = [s for rec in by_rank.values() for s in rec.get("steps", []) if "error" in s]
    if programs.must_fail(program) and not errors:
        problems.append("no rank saw an error, but the ranks cannot all have succeeded")
    return problems


def run_programs(size: int, seeds: List[Tuple[int, str]], tmp_path: Path) -> Tuple[int, float]:
    """Runs (seed, divergence) programs at `size` ranks; returns (programs, slowest error s)."""
    made = [programs.make_program(seed, size, divergence) for seed, divergence in seeds]
    problems, slowest = [], 0.0
    for number, batch in enumerate(programs.batches(made, PER_BATCH)):
        job_dir = tmp_path / f"np{size}-job{number}"
        job_dir.mkdir()
        records = run_batch(size, batch, job_dir)
        for program in batch:
            by_rank = {r: next((x for x in recs if x["seed"] == program.seed), None)
                       for r, recs in records.items()}
            by_rank = {r: x for r, x in by_rank.items() if x is not None}
            for problem in check_program(program, by_rank):
                problems.append(f"{program.describe()}\n  {problem}")
            for rec in by_rank.values():
                for step in rec.get("steps", []):
                    if "error" in step:
                        slowest = max(slowest, step["seconds"])
    assert not problems, "\n".join(problems)
    return len(made), slowest


def fixed_seeds(size: int) -> List[Tuple[int, str]]:
    """One program per divergence kind (and two without), seeds fixed by kind."""
    seeds = [(1000 * size + i, kind) for i, kind in enumerate(programs.DIVERGENCES)]
    return seeds + [(1000 * size + 90, None), (1000 * size + 91, None)]


@pytest.mark.skipif(LONG_RUN > 0, reason="HVDKERAS_FUZZ_PROGRAMS runs the long fuzz instead")
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("size", (2, 3), ids=lambda n: f"np{n}")
def test_every_divergence_ends_every_rank(size, tmp_path):
    run_programs(size, fixed_seeds(size), tmp_path)


@pytest.mark.skipif(LONG_RUN <= 0, reason="set HVDKERAS_FUZZ_PROGRAMS=N for the long fuzz run")
@pytest.mark.timeout(0)
def test_long_fuzz_run(tmp_path, capsys):
    start = time.monotonic()
    per_size = {2: LONG_RUN // 2, 3: LONG_RUN - LONG_RUN // 2}
    total, slowest = 0, 0.0
    for size, count in per_size.items():
        n, s = run_programs(size, [(seed, "random") for seed in range(1, count + 1)], tmp_path)
        total, slowest = total + n, max(slowest, s)
    with capsys.disabled():
        print(f"\nfuzz: {total} programs, 0 hangs, slowest time to error {slowest:.1f} s "
              f"(stall bound {STALL_S:g} s), {time.monotonic() - start:.0f} s")

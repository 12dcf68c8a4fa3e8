"""Running divergence-fuzzer programs under mpiexec and checking what came out.

Shared by tests/test_divergence_fuzz.py and tests/test_many_ranks.py; see the
former for what is checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple

import programs
from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent / "rank_program.py"
STALL_S = 3.0
MARGIN_S = 6.0          # scheduling on a loaded 2-core machine, graph building
PER_BATCH = 8
STARTUP_S = 120.0       # TensorFlow's import and hvdkeras.init() on every rank


def program_bound(program: programs.Program, stall_s: float) -> float:
    """The most one program may take on a rank: every step a double stall,
    the sleep, the resync's attempts."""
    steps = len(program.steps) + 1
    return steps * (2 * stall_s + 2.0) + stall_s + 1.5 + 5 * stall_s + MARGIN_S


def run_batch(size: int, batch: List[programs.Program], tmp_path: Path,
              stall_s: float) -> Dict[int, List[dict]]:
    """Runs one job; returns rank -> its program records, in order."""
    timeout = STARTUP_S * max(1, size // 4) + sum(program_bound(p, stall_s) for p in batch)
    result = run_under_mpi(
        size, [str(SCRIPT), str(tmp_path), *[programs.spec(p) for p in batch]],
        timeout=timeout,
        env={"HVDKERAS_STALL_SHUTDOWN_SECONDS": str(stall_s),
             "FUZZ_SLEEP_SECONDS": str(stall_s + 1.5)})
    records = {}
    for r in range(size):
        path = tmp_path / f"rank{r}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records[r] = [json.loads(line) for line in lines]
    left = any(programs.ends_job(p) for p in batch)
    assert result.returncode == 0 or left, describe(result)
    return records


def check_program(program: programs.Program, by_rank: Dict[int, dict],
                  stall_s: float) -> List[str]:
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
            limit = (len(program.steps) + 1) * (2 * stall_s + 2) if step.get("join") else (
                2 * stall_s + MARGIN_S)
            if step["seconds"] > limit:
                problems.append(f"rank {rank} waited {step['seconds']:.1f} s > {limit} s: {step}")
            before = program.divergence is None or step.get("i", 99) < program.at
            if before and ("error" in step or "wrong" in step) and not step.get("join"):
                problems.append(f"rank {rank} failed before any divergence: {step}")
            if "wrong" in step and program.divergence is None:
                problems.append(f"rank {rank} got a wrong result: {step}")
        # After a failed join() the ranks disagree on who has joined: the
        # resync may take a stand-in for a rank that joined late (its value
        # is not checked), and a rank whose late join outlives the others'
        # job is shut down with them (a clean end).
        if leaves or exits:
            continue  # a rank left: the others end cleanly, no resync to check
        join_failed = any("error" in s and s.get("join")
                          for rec in by_rank.values() for s in rec.get("steps", []))
        sync = record["sync"]
        shut_down = sync.get("errors") and all("shut down" in e for e in sync["errors"])
        if not (sync["ok"] or (join_failed and (shut_down or "value" in sync))):
            problems.append(f"rank {rank}: the engine did not work afterwards: {sync}")
    errors = [s for rec in by_rank.values() for s in rec.get("steps", []) if "error" in s]
    if programs.must_fail(program) and not errors:
        problems.append("no rank saw an error, but the ranks cannot all have succeeded")
    return problems


def run_programs(size: int, seeds: List[Tuple[int, str]], tmp_path: Path,
                 stall_s: float = STALL_S) -> Tuple[int, float]:
    """Runs (seed, divergence) programs at `size` ranks; returns (programs, slowest error s)."""
    made = [programs.make_program(seed, size, divergence) for seed, divergence in seeds]
    problems, slowest = [], 0.0
    for number, batch in enumerate(programs.batches(made, PER_BATCH)):
        job_dir = tmp_path / f"np{size}-job{number}"
        job_dir.mkdir()
        records = run_batch(size, batch, job_dir, stall_s)
        for program in batch:
            by_rank = {r: next((x for x in recs if x["seed"] == program.seed), None)
                       for r, recs in records.items()}
            by_rank = {r: x for r, x in by_rank.items() if x is not None}
            for problem in check_program(program, by_rank, stall_s):
                problems.append(f"{program.describe()}\n  {problem}")
            for rec in by_rank.values():
                for step in rec.get("steps", []):
                    if "error" in step:
                        slowest = max(slowest, step["seconds"])
    assert not problems, "\n".join(problems)
    return len(made), slowest

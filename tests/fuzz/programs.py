"""Seeded per-rank programs for the divergence fuzzer: pure logic, no MPI.

A program is a list of collective steps that every rank runs alike, plus at
most one divergence: at one step, one or more ranks do something else (skip
the collective, add one, swap two, send another shape, dtype, kind or name,
raise and go on, leave early, sleep past the stall bound, join early). Every
rank derives the same program from the seed, then the actions of its own
rank from it (`actions_for`), so a program is reproduced from
(seed, size) alone.

`tests/fuzz/rank_program.py` runs the actions on each rank of an MPI job and
`tests/test_divergence_fuzz.py` checks what came out.
"""

from __future__ import annotations

import dataclasses
import random
from typing import List, Optional, Sequence, Tuple

# Collectives a step can run, and the modes they can run in. Object
# collectives, barrier and join are eager calls only.
TENSOR_KINDS = ("allreduce", "grouped_allreduce", "sparse_allreduce", "allgather",
                "grouped_allgather", "broadcast", "alltoall", "reducescatter", "set_allreduce")
EAGER_KINDS = ("barrier", "broadcast_object", "allgather_object")
KINDS = TENSOR_KINDS + EAGER_KINDS
MODES = ("eager", "function", "graph")
DTYPES = ("float32", "int32", "float64")

DIVERGENCES = ("skip", "extra", "reorder", "shape", "dtype", "kind", "name", "raise", "exit",
               "sleep", "join_early")
# Divergences after which some rank must see an error (the others may
# legitimately succeed, e.g. a shape change of an object collective).
MUST_FAIL = ("skip", "extra", "reorder", "name", "raise", "sleep")


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective call that every rank makes alike."""

    index: int
    kind: str
    mode: str
    dtype: str
    cols: int

    def name(self, seed: int) -> str:
        return f"fuzz{seed}.s{self.index}.{self.kind}"


@dataclasses.dataclass(frozen=True)
class Program:
    seed: int
    size: int
    steps: Tuple[Step, ...]
    divergence: Optional[str]  # None: every rank runs the same steps
    ranks: Tuple[int, ...]     # the ranks that diverge
    at: int                    # the step where they do

    def describe(self) -> str:
        kinds = " ".join(f"{s.kind}/{s.mode}" for s in self.steps)
        what = (f"{self.divergence} on rank(s) {list(self.ranks)} at step {self.at}"
                if self.divergence else "no divergence")
        return f"program {self.seed} ({self.size} ranks, {what}): {kinds}"


@dataclasses.dataclass(frozen=True)
class Action:
    """What one rank does next: run a step (maybe altered), raise, sleep, exit, join."""

    what: str                 # "run", "raise", "sleep", "exit", "join"
    step: Optional[Step] = None
    name_suffix: str = ""     # "name" divergence: another name
    kind: Optional[str] = None  # "kind" divergence: another collective under the same name
    extra_cols: int = 0       # "shape" divergence
    dtype: Optional[str] = None  # "dtype" divergence
    seconds: float = 0.0      # "sleep"
    checked: bool = True      # whether the result can be checked exactly


def _random_step(rng: random.Random, index: int, size: int) -> Step:
    kinds = [k for k in KINDS if size >= 3 or k != "set_allreduce"]
    kind = rng.choice(kinds)
    mode = "eager" if kind in EAGER_KINDS else rng.choice(MODES)
    dtype = rng.choice(DTYPES)
    if kind == "reducescatter" and dtype == "int32":
        dtype = "float32"
    return Step(index=index, kind=kind, mode=mode, dtype=dtype, cols=rng.randint(1, 4))


def make_program(seed: int, size: int, divergence: Optional[str] = "random",
                 steps: int = 0) -> Program:
    """The program of `seed` for `size` ranks.

    Args:
        seed: Decides everything.
        size: The number of ranks (at least 2).
        divergence: One of DIVERGENCES, None for none, or "random" (any,
            or none one time in eight).
        steps: The number of steps (default: 3 to 6, from the seed).
    """
    rng = random.Random(seed * 7919 + size)
    count = steps or rng.randint(3, 6)
    program_steps = tuple(_random_step(rng, i, size) for i in range(count))
    # Drawn whatever `divergence` says, so that a program named by its
    # divergence (spec/from_spec) is the same program as the random one.
    drawn = None if rng.random() < 0.125 else rng.choice(DIVERGENCES)
    if divergence == "random":
        divergence = drawn
    if divergence is None:
        return Program(seed, size, program_steps, None, (), -1)
    many = rng.random() < 0.25 and size > 2
    ranks = tuple(sorted(rng.sample(range(size), rng.randint(2, size - 1) if many else 1)))
    at = rng.randrange(count - 1) if divergence == "reorder" else rng.randrange(count)
    return Program(seed, size, program_steps, divergence, ranks, at)


def spec(program: Program) -> str:
    """The command-line form of a program: "SEED:KIND" (KIND "none" without divergence)."""
    return f"{program.seed}:{program.divergence or 'none'}"


def from_spec(text: str, size: int) -> Program:
    """The program `spec` wrote (or "SEED" alone: a random divergence)."""
    seed, _, kind = text.partition(":")
    divergence = {"": "random", "none": None}.get(kind, kind)
    return make_program(int(seed), size, divergence)


def _other_kind(kind: str) -> str:
    """A collective that accepts the same tensors but is a different op."""
    return {"allreduce": "allgather", "allgather": "allreduce",
            "grouped_allreduce": "grouped_allgather", "grouped_allgather": "grouped_allreduce",
            "broadcast": "allreduce", "reducescatter": "allreduce", "alltoall": "allgather",
            "sparse_allreduce": "allreduce", "set_allreduce": "allreduce",
            "barrier": "allreduce", "broadcast_object": "allgather_object",
            "allgather_object": "broadcast_object"}[kind]


def actions_for(program: Program, rank: int, sleep_seconds: float) -> List[Action]:
    """What `rank` does, step by step, in `program`.

    `sleep_seconds` is how long a "sleep" divergence waits (the test passes
    the stall bound plus a little, so the other ranks' wait ends first).
    """
    actions = [Action("run", s) for s in program.steps]
    if program.divergence is None or rank not in program.ranks:
        return actions
    k, step = program.at, program.steps[program.at]
    kind = program.divergence
    if kind == "skip":
        del actions[k]
    elif kind == "extra":
        actions.insert(k, Action("run", dataclasses.replace(step, index=step.index + 100)))
    elif kind == "reorder":
        actions[k], actions[k + 1] = actions[k + 1], actions[k]
    elif kind == "shape":
        actions[k] = Action("run", step, extra_cols=1, checked=False)
    elif kind == "dtype":
        other = "int32" if step.dtype != "int32" else "float32"
        actions[k] = Action("run", step, dtype=other, checked=False)
    elif kind == "kind":
        actions[k] = Action("run", step, kind=_other_kind(step.kind), checked=False)
    elif kind == "name":
        actions[k] = Action("run", step, name_suffix=".other", checked=False)
    elif kind == "raise":
        actions[k] = Action("raise", step)
    elif kind == "exit":
        actions[k:] = [Action("exit")]
    elif kind == "sleep":
        actions.insert(k, Action("sleep", seconds=sleep_seconds))
    elif kind == "join_early":
        actions[k:] = [Action("join")]
    return actions


def ends_job(program: Program) -> bool:
    """Whether some rank leaves the job in this program (nothing may follow it)."""
    return program.divergence == "exit"


def uses_join(program: Program) -> bool:
    """Whether the ranks that did not join early must join at the end."""
    return program.divergence == "join_early"


def set_ranks(size: int) -> Tuple[int, ...]:
    """The ranks of the process set that "set_allreduce" steps use: all but the last."""
    return tuple(range(size - 1))


def _sequence(program: Program, rank: int, on_set: bool) -> List[str]:
    """The names of the collectives `rank` runs on the global set or the process set."""
    names = []
    for action in actions_for(program, rank, sleep_seconds=0.0):
        if action.what != "run":
            continue
        in_set = (action.kind or action.step.kind) == "set_allreduce"
        if in_set == on_set and (not in_set or rank in set_ranks(program.size)):
            names.append(action.step.name(program.seed) + action.name_suffix)
    return names


def must_fail(program: Program) -> bool:
    """Whether some rank must see an error: the ranks cannot all succeed.

    The members of each communicator (all ranks; the process set's) must run
    the same collectives in the same order, or some rank waits in one the
    others never run; a sleeping rank makes the others wait past the bound
    if a later step needs it.
    """
    if program.divergence not in MUST_FAIL:
        return False
    if program.divergence == "sleep":
        members = set(set_ranks(program.size))
        return any(s.kind != "set_allreduce" or any(r in members for r in program.ranks)
                   for s in program.steps[program.at:])
    for on_set, ranks in ((False, range(program.size)), (True, set_ranks(program.size))):
        sequences = {tuple(_sequence(program, r, on_set)) for r in ranks}
        if len(sequences) > 1:
            return True
    return False


def batches(programs: Sequence[Program], per_batch: int) -> List[List[Program]]:
    """Programs grouped into jobs of at most `per_batch`; a program in which a
    rank leaves ends its job, so it is always last in its batch."""
    out: List[List[Program]] = []
    current: List[Program] = []
    for program in programs:
        current.append(program)
        if ends_job(program) or len(current) == per_batch:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out

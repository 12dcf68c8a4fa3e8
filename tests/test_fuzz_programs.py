"""The divergence fuzzer's program generator (tests/fuzz/programs.py): pure logic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import programs  # noqa: E402


def test_a_seed_gives_the_same_program_on_every_rank():
    a = programs.make_program(17, 3)
    assert a == programs.make_program(17, 3)
    assert programs.from_spec(programs.spec(a), 3) == a
    for seed in range(50):  # a random program and the same one named by its kind
        p = programs.make_program(seed, 3)
        assert programs.from_spec(programs.spec(p), 3) == p
    assert programs.make_program(18, 3) != a


def test_modes_fit_the_collectives():
    for seed in range(200):
        for step in programs.make_program(seed, 3).steps:
            if step.kind in programs.EAGER_KINDS:
                assert step.mode == "eager", step
            assert step.mode in programs.MODES


def test_process_set_steps_only_with_three_ranks_or_more():
    kinds = {s.kind for seed in range(300) for s in programs.make_program(seed, 2).steps}
    assert "set_allreduce" not in kinds
    kinds = {s.kind for seed in range(300) for s in programs.make_program(seed, 3).steps}
    assert kinds == set(programs.KINDS)


@pytest.mark.parametrize("kind", programs.DIVERGENCES)
def test_only_the_diverging_ranks_act_differently(kind):
    program = programs.make_program(5, 4, kind)
    assert program.divergence == kind and program.ranks
    plain = [programs.Action("run", s) for s in program.steps]
    for rank in range(4):
        actions = programs.actions_for(program, rank, sleep_seconds=3.0)
        if rank in program.ranks:
            assert actions != plain, (kind, rank)
        else:
            assert actions == plain, (kind, rank)


def test_each_divergence_does_what_its_name_says():
    def diverging(kind):
        program = programs.make_program(11, 2, kind, steps=4)
        return program, programs.actions_for(program, program.ranks[0], 2.5)

    program, actions = diverging("skip")
    assert [a.step for a in actions] == [s for s in program.steps if s.index != program.at]
    program, actions = diverging("reorder")
    k = program.at
    assert [a.step.index for a in actions[k:k + 2]] == [k + 1, k]
    program, actions = diverging("sleep")
    assert actions[program.at] == programs.Action("sleep", seconds=2.5)
    program, actions = diverging("exit")
    assert actions[-1].what == "exit" and len(actions) == program.at + 1
    program, actions = diverging("name")
    assert actions[program.at].name_suffix and not actions[program.at].checked
    program, actions = diverging("kind")
    assert actions[program.at].kind != program.steps[program.at].kind


def test_random_programs_cover_every_divergence_and_none():
    found = {programs.make_program(seed, 3).divergence for seed in range(400)}
    assert found == set(programs.DIVERGENCES) | {None}


def test_a_rank_leaving_ends_its_batch():
    made = [programs.make_program(s, 2, "exit" if s in (2, 7) else None) for s in range(10)]
    batches = programs.batches(made, per_batch=4)
    assert [[p.seed for p in b] for b in batches] == [[0, 1, 2], [3, 4, 5, 6], [7], [8, 9]]


def test_must_fail():
    assert not programs.must_fail(programs.make_program(1, 2, None))
    assert programs.must_fail(programs.make_program(1, 2, "skip"))
    assert not programs.must_fail(programs.make_program(1, 2, "shape"))  # objects may agree
    # Two ranks that swap the same two steps agree with each other.
    p = programs.make_program(30, 3, "reorder")
    if p.ranks == (0, 1) and p.steps[0].kind == "set_allreduce":
        assert not programs.must_fail(p)
    # A set step fails only when some of its members skip it and others do not
    # (a rank outside the set never runs it anyway).
    for seed in range(200):
        p = programs.make_program(seed, 3, "skip")
        if p.steps[p.at].kind == "set_allreduce":
            skipping = {r in p.ranks for r in programs.set_ranks(3)}
            assert programs.must_fail(p) == (len(skipping) > 1), p

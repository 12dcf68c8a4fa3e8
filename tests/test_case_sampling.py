"""The pairwise choice of cases (tests/case_sampling.py), without MPI."""

import random
from itertools import combinations, product

from case_sampling import MIN_CASES, pairwise_keep


def _pairs(case):
    return set(combinations(sorted(case.items()), 2))


def test_every_pair_of_settings_is_kept_and_fewer_cases_run():
    cases = [{"dtype": d, "shape": s, "op": o, "mode": m}
             for d, s, o, m in product(range(10), range(4), range(3), ("eager", "function"))]
    keep = pairwise_keep(cases)
    kept = [c for c, k in zip(cases, keep) if k]
    assert set().union(*map(_pairs, kept)) == set().union(*map(_pairs, cases))
    assert len(kept) <= 60 < len(cases)  # 240 cases; 40 dtype x shape pairs at least


def test_the_choice_reads_only_which_values_are_equal():
    # Ranks may label a value differently (a repr with an address); each
    # labels equal values alike, so each must keep the same cases.
    cases = [{"a": a, "b": b, "c": c} for a, b, c in product(range(5), range(4), range(3))]
    rng = random.Random(7)
    for _ in range(5):
        labels = {(name, v): f"<object at 0x{rng.getrandbits(48):x}>"
                  for case in cases for name, v in case.items()}
        relabelled = [{name: labels[(name, v)] for name, v in case.items()} for case in cases]
        assert pairwise_keep(relabelled) == pairwise_keep(cases)


def test_small_products_and_two_parameter_tests_run_whole():
    small = [{"a": a, "b": b, "c": c} for a, b, c in product(range(2), range(3), range(3))]
    assert len(small) < MIN_CASES and all(pairwise_keep(small))
    two = [{"a": a, "b": b} for a, b in product(range(10), range(10))]
    assert all(pairwise_keep(two))

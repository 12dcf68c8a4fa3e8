"""Pairwise selection of a parametrized test's cases, for the jobs whose
subject is a layout rather than the cases (simulated hosts, many ranks, lab
hosts): every pair of values of any two parameters still runs together in
some case, and the full product runs at 1 to 3 ranks on one host
(tests/test_collectives_mpi.py). See Note [pairwise cases] in
tests/parallel/conftest.py."""

from __future__ import annotations

from itertools import combinations
from typing import Dict, Hashable, List, Sequence

# A test is sampled only when it has at least this many cases and three or
# more parameters: below that the product is already small.
MIN_CASES = 24
MIN_PARAMETERS = 3


def pairwise_keep(cases: Sequence[Dict[str, Hashable]]) -> List[bool]:
    """Which of one test's cases to keep so that every pair of (parameter,
    value) settings that occurs in some case occurs in a kept one. Greedy:
    the case that covers the most pairs not yet covered is kept next (the
    earliest on a tie), so the choice depends only on the cases and their
    order, which every rank collects alike.

    Args:
        cases: each case's parameters, name to a hashable form of its value.

    Returns:
        One flag per case, True for the cases to run.

    Example:
        >>> cases = [{"a": a, "b": b, "c": c} for a in range(4) for b in range(3)
        ...          for c in range(2)]
        >>> sum(pairwise_keep(cases))
        12
    """
    if len(cases) < MIN_CASES or min((len(c) for c in cases), default=0) < MIN_PARAMETERS:
        return [True] * len(cases)
    pairs = [set(combinations(sorted(case.items(), key=lambda item: item[0]), 2))
             for case in cases]
    uncovered = set().union(*pairs)
    keep = [False] * len(cases)
    while uncovered:
        best = max(range(len(cases)), key=lambda i: (len(pairs[i] & uncovered), -i))
        keep[best] = True
        uncovered -= pairs[best]
    return keep

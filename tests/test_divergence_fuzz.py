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

import os
import sys
import time
from pathlib import Path
from typing import List, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import programs  # noqa: E402
from harness import STALL_S, run_programs  # noqa: E402

LONG_RUN = int(os.environ.get("HVDKERAS_FUZZ_PROGRAMS", "0") or 0)

pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow]


def fixed_seeds(size: int) -> List[Tuple[int, str]]:
    """One program per divergence kind (and two without), seeds fixed by kind."""
    seeds = [(1000 * size + i, kind) for i, kind in enumerate(programs.DIVERGENCES)]
    return seeds + [(1000 * size + 90, None), (1000 * size + 91, None)]


@pytest.mark.skipif(LONG_RUN > 0, reason="HVDKERAS_FUZZ_PROGRAMS runs the long fuzz instead")
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("size", (pytest.param(2, marks=pytest.mark.light), 3),
                         ids=lambda n: f"np{n}")
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

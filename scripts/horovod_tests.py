#!/usr/bin/env python3
"""Runs Horovod's own TensorFlow test files on hvdkeras, unchanged, and counts.

Horovod's tests import `horovod.tensorflow` and `horovod.tensorflow.keras`;
scripts/horovod_alias/ provides those names as re-exports of hvdkeras. This
is a compatibility measurement, kept outside the project's suite: Horovod's
files are not part of this repository (fetch Horovod's repository and pass
its path).

    python scripts/horovod_tests.py /path/to/horovod --np 2

For each file, every rank runs the same pytest session under mpiexec and
writes a JUnit report; a test counts as passed when it passed on every rank
(its subtests included), as skipped when rank 0 skipped it, else as failed.
Horovod's test utilities need `mock` and `parameterized`: the script
installs them into the running interpreter's environment when missing.
Each rank's pytest output goes to OUT/<file>.<rank>.log.

The ranks run with HVDKERAS_COLLECTIVE_GRADIENTS=horovod (Horovod's scaling
of the allgather, broadcast and reducescatter gradients, which Horovod's
gradient tests assert) unless `--exact-gradients` is given. With hvdkeras's
default, exact gradients those tests fail on some ranks only, and the ranks
that pass go on alone into the next test, which then fails for that reason
too: the counts would measure the cascade, not the compatibility.

Exit status: 0 (the counts are the result, not a verdict).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List

ALIAS = Path(__file__).resolve().parent / "horovod_alias"
DEFAULT_FILES = ("test/parallel/test_tensorflow.py", "test/parallel/test_tensorflow2_keras.py")
TEST_DEPENDENCIES = ("mock", "parameterized")


def ensure_dependencies() -> None:
    missing = [m for m in TEST_DEPENDENCIES if importlib.util.find_spec(m) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def outcomes(report: Path) -> Dict[str, str]:
    """test name -> passed / failed / skipped, from one rank's JUnit file."""
    result: Dict[str, str] = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = case.get("name", "").split("[")[0]  # subtests report as name [mode]
        if case.find("failure") is not None or case.find("error") is not None:
            state = "failed"
        elif case.find("skipped") is not None:
            state = "skipped"
        else:
            state = "passed"
        previous = result.get(name)
        if previous == "failed" or (previous == "passed" and state == "skipped"):
            continue
        result[name] = state
    return result


def slowest(out: Path, stem: str, count: int = 5) -> List[tuple]:
    """The `count` longest (seconds, rank, test) over every rank's JUnit report."""
    found = []
    for report in sorted(out.glob(f"{stem}.*.xml")):
        rank = report.suffixes[0].lstrip(".")
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            found.append((float(case.get("time") or 0.0), rank, case.get("name", "")))
    return sorted(found, reverse=True)[:count]


def run_file(horovod: Path, test_file: str, np: int, out: Path, timeout: int,
             per_test: int = 300, gradients: str = "horovod",
             stall_seconds: float = 30.0) -> Dict[str, str]:
    """Runs one of Horovod's test files at `np` ranks; test name -> outcome.

    A test that runs past `per_test` seconds fails (pytest-timeout) instead
    of holding up the rest.
    """
    path = horovod / test_file
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([str(ALIAS), str(path.parent),
                                           str(horovod / "test" / "utils"),
                                           os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"),
               HVDKERAS_STALL_SHUTDOWN_SECONDS=f"{stall_seconds:g}",
               HVDKERAS_COLLECTIVE_GRADIENTS=gradients)
    stem = path.stem
    # Each rank names its own report after its rank (MPICH and Open MPI variables).
    command = (f'r="${{PMI_RANK:-${{OMPI_COMM_WORLD_RANK:-0}}}}"; exec "{sys.executable}" -m '
               f'pytest -v -p no:cacheprovider --timeout={per_test} "{path}" '
               f'--junitxml="{out}/{stem}.$r.xml" > "{out}/{stem}.$r.log" 2>&1')
    with open(out / f"{stem}.log", "w") as log:
        subprocess.run(["mpiexec", "-n", str(np), "sh", "-c", command], cwd=path.parent,
                       env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    per_rank = [outcomes(out / f"{stem}.{r}.xml") for r in range(np)
                if (out / f"{stem}.{r}.xml").exists()]
    if not per_rank:
        return {}
    merged = {}
    for name, state in per_rank[0].items():
        states = [ranks.get(name, "failed") for ranks in per_rank]
        if state == "skipped":
            merged[name] = "skipped"
        else:
            merged[name] = "passed" if all(s == "passed" for s in states) else "failed"
    return merged


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horovod", type=Path, help="a checkout of Horovod's repository")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--files", nargs="*", default=list(DEFAULT_FILES))
    parser.add_argument("--out", type=Path, default=None, help="where logs and reports go")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--exact-gradients", action="store_true",
                        help="keep hvdkeras's default gradient convention")
    parser.add_argument("--stall-shutdown-seconds", type=float, default=30.0,
                        help="HVDKERAS_STALL_SHUTDOWN_SECONDS for the ranks (default 30)")
    args = parser.parse_args(argv)
    ensure_dependencies()
    out = args.out or Path(tempfile.mkdtemp(prefix="horovod-tests-"))
    out.mkdir(parents=True, exist_ok=True)
    for test_file in args.files:
        started = time.monotonic()
        merged = run_file(args.horovod, test_file, args.np, out, args.timeout,
                          gradients="exact" if args.exact_gradients else "horovod",
                          stall_seconds=args.stall_shutdown_seconds)
        took = time.monotonic() - started
        counts = collections.Counter(merged.values())
        print(f"{test_file} at {args.np} ranks: {counts['passed']} passed, "
              f"{counts['failed']} failed, {counts['skipped']} skipped "
              f"(of {len(merged)}) in {took:.0f} s; log and reports in {out}")
        for seconds, rank, name in slowest(out, Path(test_file).stem):
            print(f"  slowest: {seconds:6.1f} s = {seconds / args.stall_shutdown_seconds:4.1f} "
                  f"stall bounds, rank {rank}: {name}")
        for name in sorted(n for n, s in merged.items() if s == "failed"):
            print(f"  failed: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Launches Python under ``mpiexec`` (or plainly) for the multi-rank tests.

Every job runs in its own process group (session), so a timeout can kill
``mpiexec``, its proxies and every rank at once instead of leaving orphans
that hold the machine or the MPI ports.

Note [one file per rank]
~~~~~~~~~~~~~~~~~~~~~~~~
Two ranks writing to one stream interleave: a line one rank writes in two
pieces (Python writes a print's text and its newline separately) can have
the other rank's output land in between, and pytest's summaries have come
out as "18 passed in 5.36s18 passed in 5.35s". So `run_under_mpi` has
mpiexec write each rank's stdout and stderr to files of their own and
returns them per rank (`MpiResult.ranks`); tests read a rank's outcome from
its own output or from files the rank writes (the per-rank pytest sessions
write `rank<N>.json` through `tests/conftest.py`), never from a merged
stream. Jobs started through `hvdkerasrun` are read from its rank-tagged
lines instead.

Note [lean imports in launched processes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
`import tensorflow` imports jax, pandas and matplotlib.pyplot whenever they
are installed (TensorFlow Lite's JAX converter, Keras's DataFrame inputs and
image gallery), and the main environment has all three for the other
backends, Spark and the report: about 2 of the 5-7 s that each rank spends
starting here, paid by every rank of every job in the suite. So every
process launched through `run_command` starts with tests/lean_imports/ on
PYTHONPATH, whose sitecustomize hides jax and pandas under the TensorFlow
backend (an import of them raises ImportError, which both libraries treat as
"not installed") and loads matplotlib.pyplot at its first use instead of at
import. A test whose processes need jax or pandas under TensorFlow passes
HVDKERAS_TEST_LEAN_IMPORTS=0 in their environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

# Where the per-rank pytest sessions write their reports (tests/conftest.py).
RANK_REPORT_DIR = "HVDKERAS_RANK_REPORT_DIR"
# See Note [lean imports in launched processes].
LEAN_IMPORTS_DIR = Path(__file__).resolve().parent / "lean_imports"
# How much of the combined output an AssertionError quotes.
TAIL_CHARS = 12_000


def tail(text: Optional[str], limit: int = TAIL_CHARS) -> str:
    """The last `limit` characters of `text`, marked when cut."""
    text = text or ""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def mpiexec_path() -> Path:
    """The `mpiexec` next to the running interpreter (the venv's `mpich` wheel)."""
    # Deliberately not resolved: a venv's python is often a symlink to the base
    # interpreter, and the base interpreter's directory has no mpiexec.
    return Path(sys.executable).parent / "mpiexec"


# Jobs run their ranks on GPUs only when asked (tests/test_gpu.py sets it to
# "GPU"); otherwise they hide the GPUs, so that on a GPU machine the suite's
# ranks still test the CPU path and do not all land on GPU 0.
TEST_DEVICE = "HVDKERAS_TEST_DEVICE"


def _child_env(env: Optional[Mapping[str, str]]) -> dict:
    full = dict(os.environ)
    full["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full["PYTHONUNBUFFERED"] = "1"
    full.update(env or {})
    if full.get("HVDKERAS_TEST_LEAN_IMPORTS", "1") == "1":
        full["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(LEAN_IMPORTS_DIR), full.get("PYTHONPATH")) if p)
    if full.get(TEST_DEVICE) != "GPU":
        full["CUDA_VISIBLE_DEVICES"] = ""
    return full


def _kill_group(proc: subprocess.Popen) -> None:
    """Kills the whole process group led by `proc` (SIGTERM, then SIGKILL)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            # The leader is gone; make sure nothing else in the group survives.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(cmd: Sequence[str], timeout: float = 240,
                env: Optional[Mapping[str, str]] = None,
                cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
    """Runs `cmd` in a new session, capturing stdout and stderr together.

    On timeout the whole process group is killed and an AssertionError with
    the tail of the output is raised.
    """
    cmd = [str(c) for c in cmd]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, errors="replace", env=_child_env(env), cwd=cwd, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild outside the group holds the pipe
            output = "(output unavailable: the pipe stayed open after the kill)"
        raise AssertionError(
            f"timed out after {timeout:g}s (process group killed): {' '.join(cmd)}\n"
            f"--- output tail ---\n{tail(output)}"
        ) from None
    except BaseException:  # e.g. KeyboardInterrupt or pytest-timeout: leave no orphans
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, output, None)


@dataclasses.dataclass
class RankOutput:
    """What one rank wrote."""

    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


class MpiResult(subprocess.CompletedProcess):
    """A finished mpiexec job with each rank's output kept apart.

    `ranks[r]` is rank r's output (see Note [one file per rank]); `stdout`
    holds mpiexec's own output followed by every rank's, rank by rank, each
    under a "--- rank r ---" heading, for messages and whole-job checks.
    """

    def __init__(self, args, returncode: int, launcher_output: str, ranks: List[RankOutput]):
        self.ranks = ranks
        parts = [launcher_output] + [f"--- rank {r} ---\n{out.stdout}{out.stderr}"
                                     for r, out in enumerate(ranks)]
        super().__init__(args, returncode, "\n".join(parts), None)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def per_rank_output_args(directory: Path) -> List[str]:
    """mpiexec (Hydra) options that write rank r's streams to directory/rank<r>.{out,err}."""
    return ["-outfile-pattern", str(directory / "rank%r.out"),
            "-errfile-pattern", str(directory / "rank%r.err")]


def rank_outputs(directory: Path, np: int) -> List[RankOutput]:
    return [RankOutput(_read(directory / f"rank{r}.out"), _read(directory / f"rank{r}.err"))
            for r in range(np)]


def simulated_hosts_args(hosts: str) -> List[str]:
    """mpiexec (Hydra) options that start every rank here, as if on the hosts of
    `hosts` ("h0:2,h1:2": two hosts with two slots each).

    With the fork launcher nothing is reached over the network, but MPI
    still treats each named host as a node of its own: separate
    shared-memory domains (MPI_COMM_TYPE_SHARED), and traffic between them
    through MPI's network module.
    """
    return ["-launcher", "fork", "-hosts", hosts]


def run_under_mpi(np: int, args: list[str], timeout: float = 240,
                  env: dict | None = None, hosts: str = "") -> MpiResult:
    """Runs ``mpiexec -n np <this python> *args``, each rank's output to its own files.

    Sets HVDKERAS_EXPECTED_SIZE=np (unless `env` says otherwise), so that
    hvdkeras.init() fails loudly if the ranks come up as separate worlds of
    size 1 (a launcher/MPI mismatch) instead of passing every test np times.
    `hosts` places the ranks on simulated hosts (`simulated_hosts_args`) and
    passes the list on as HVDKERAS_TEST_HOSTS.
    Raises AssertionError (with every rank's output tail) when it runs past
    `timeout`.
    """
    with tempfile.TemporaryDirectory(prefix="hvdkeras-ranks-") as tmp:
        directory = Path(tmp)
        placement = simulated_hosts_args(hosts) if hosts else []
        cmd = [mpiexec_path(), "-n", str(np), *placement, *per_rank_output_args(directory),
               sys.executable, *args]
        try:
            result = run_command(cmd, timeout=timeout,
                                 env={"HVDKERAS_EXPECTED_SIZE": str(np),
                                      **({"HVDKERAS_TEST_HOSTS": hosts} if hosts else {}),
                                      **(env or {})})
        except AssertionError as timed_out:
            job = MpiResult(cmd, -1, "", rank_outputs(directory, np))
            raise AssertionError(f"{timed_out}\n--- the ranks ---\n{tail(job.stdout)}\n"
                                 f"--- each rank's last error lines ---\n"
                                 f"{error_lines(job.ranks)}") from None
        return MpiResult(result.args, result.returncode, result.stdout,
                         rank_outputs(directory, np))


def run_python(args: list[str], timeout: float = 240,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``<this python> *args`` without mpiexec, like `run_under_mpi`."""
    return run_command([sys.executable, *args], timeout=timeout, env=env)


# A glog line from TensorFlow or XLA ("E0000 00:00:... file.cc:52] ..."): its
# start-up noise names errors too (a failed cuInit on a CPU machine).
_GLOG_LINE = re.compile(r"^[IWEF]\d{4} ")
_ERROR_WORDS = ("Error", "ERROR", "error:", "Traceback", "MPI_Abort", "Aborted", "Fatal")


def error_lines(ranks: Sequence["RankOutput"], per_rank: int = 3) -> str:
    """Each rank's last lines that name an error, one block per rank.

    A failure message quotes the job's output tail, and tools that show
    failures cut long messages in the middle: with many ranks the rank that
    failed can fall into the cut. This summary goes last, so it survives.
    """
    blocks = []
    for r, out in enumerate(ranks):
        found = [line.strip()[:300] for line in out.text.splitlines()
                 if any(w in line for w in _ERROR_WORDS) and not _GLOG_LINE.match(line)]
        blocks.append(f"rank {r}: " + (" | ".join(found[-per_rank:]) if found else "(none)"))
    return "\n".join(blocks)


def describe(result: subprocess.CompletedProcess) -> str:
    """A failure message: the command, its exit status, its output tail and,
    for an MPI job, each rank's last error lines (`error_lines`)."""
    text = (f"exit status {result.returncode}: {' '.join(map(str, result.args))}\n"
            f"--- output tail ---\n{tail(result.stdout)}")
    if isinstance(result, MpiResult):
        text += f"\n--- each rank's last error lines ---\n{error_lines(result.ranks)}"
    return text


def run_pytest_under_mpi(np: int, test_file: Path | Sequence[Path], timeout: float,
                         env: dict | None = None,
                         extra_args: Sequence[str] = (),
                         hosts: str = "") -> tuple[MpiResult, List[dict]]:
    """Runs one pytest session per rank on `test_file`; returns the job and every
    rank's report (written by `tests/conftest.py`; see Note [one file per rank]).

    Each report holds the rank, pytest's exit status and the number of tests
    that passed, failed, errored and were skipped there. `test_file` may be a
    directory or a list of files (one session over all of them); `hosts` as
    in `run_under_mpi`.
    """
    files = [test_file] if isinstance(test_file, (str, Path)) else list(test_file)
    with tempfile.TemporaryDirectory(prefix="hvdkeras-reports-") as reports:
        result = run_under_mpi(
            np, ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *extra_args,
                 *map(str, files)],
            timeout=timeout,
            env={"HVDKERAS_UNDER_MPI": "1", RANK_REPORT_DIR: reports, **(env or {})},
            hosts=hosts)
        found = sorted(Path(reports).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        return result, [json.loads(p.read_text()) for p in found]


def assert_every_rank_passed(np: int, result: MpiResult, reports: List[dict]) -> None:
    """Each of the np ranks reported a session that collected tests and failed none
    (a file whose cases all need more ranks is skipped as a whole at np=1)."""
    assert result.returncode == 0, describe(result)
    assert [r["rank"] for r in reports] == list(range(np)), describe(result)
    for report in reports:
        assert report["exitstatus"] == 0 and report["failed"] == report["errors"] == 0, (
            report, describe(result))
        assert report["passed"] + report["skipped"] > 0, (report, describe(result))

"""TensorFlow's start-up lines stay off the terminal by default, and the
user's log level wins (Note [quiet start-up] in
hvdkeras/runner/startup_noise.py).

The pure rules first (the lines below are copied from TensorFlow 2.21 runs
here, with and without a GPU driver); then real runs: `hvdkerasrun` ranks
importing TensorFlow, and `hvdkeras check`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from hvdkeras.runner import startup_noise
from mpi_runner import describe

BIN = Path(sys.executable).parent
TIMEOUT = 240

STARTUP_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795509083.889762   18346 port.cc:153] oneDNN custom operations are on. You may "
    "see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795509083.997051   18346 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, in "
    "other operations, rebuild TensorFlow with the appropriate compiler flags.",
    "E0000 00:00:1795509094.143077   18367 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
]
OTHER_LINES = [
    "Epoch 1/3",
    "E0000 00:00:1795509094.143077   18367 cuda_driver.cc:1100] failed to allocate 2.00GiB",
    "W0000 00:00:1795509094.143077   18367 op_level_cost_estimator.cc:699] Error in "
    "PredictCost() for the op",
    "hvdkeras: the op library has its GPU part, but no NVIDIA driver is installed",
    "Traceback (most recent call last):",
]


@pytest.mark.parametrize("line", STARTUP_LINES)
def test_startup_lines_are_recognised(line):
    assert startup_noise.is_startup_noise(line)
    assert startup_noise.is_startup_noise(line + "\n")


@pytest.mark.parametrize("line", OTHER_LINES)
def test_other_lines_are_kept(line):
    assert not startup_noise.is_startup_noise(line)


def test_quiet_unless_the_user_chose_a_level():
    assert startup_noise.quiet_env({}) == {"TF_CPP_MIN_LOG_LEVEL": "2",
                                           "HVDKERAS_QUIET_STARTUP": "1"}
    # TensorFlow's own level cannot hide the start-up lines: setting it
    # (usually to 2, "be quiet") keeps the filter on and the level as set.
    for level in ("0", "2", "3"):
        assert startup_noise.quiet_env({"TF_CPP_MIN_LOG_LEVEL": level}) == {
            "HVDKERAS_QUIET_STARTUP": "1"}
    assert startup_noise.quiet_env({"HVDKERAS_LOG_LEVEL": "info"}) == {}
    assert startup_noise.quiet_requested({"HVDKERAS_QUIET_STARTUP": "1"})
    assert not startup_noise.quiet_requested({})


def _noise_in(text: str) -> list:
    return [line for line in text.splitlines()
            if startup_noise.is_startup_noise(line.split(">: ", 1)[-1])]


def _env_without_levels(**extra) -> dict:
    # The test runner sets TF_CPP_MIN_LOG_LEVEL for its children; these runs
    # need the user's environment as it would be without one.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CPP_MIN_LOG_LEVEL", "HVDKERAS_LOG_LEVEL", "HVDKERAS_QUIET_STARTUP")}
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env.update(extra)
    return env


def _run_clean(cmd, env, cwd=None):
    """run_command, but without the log level it adds for every child."""
    import subprocess

    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                            timeout=TIMEOUT, cwd=cwd, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    result.stdout = result.stdout + result.stderr
    return result


IMPORT_TF = "import tensorflow as tf; print('value', int(tf.constant(1) + 1))"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("tf_level", [None, "2"], ids=["nothing-set", "TF_CPP_MIN_LOG_LEVEL=2"])
def test_launched_ranks_are_quiet_by_default_and_logs_keep_everything(tmp_path, tf_level):
    """Quiet with nothing set, and no noisier with TensorFlow's usual "be
    quiet" level set."""
    env = _env_without_levels(**({"TF_CPP_MIN_LOG_LEVEL": tf_level} if tf_level else {}))
    result = _run_clean([BIN / "hvdkerasrun", "-np", "2", "--output-dir", tmp_path,
                         sys.executable, "-c", IMPORT_TF], env)
    assert result.returncode == 0, describe(result)
    assert "[0]<stdout>: value 2" in result.stdout and "[1]<stdout>: value 2" in result.stdout
    assert _noise_in(result.stdout) == [], describe(result)
    # The per-rank log still holds them: nothing is lost.
    assert _noise_in((tmp_path / "rank.0.log").read_text()), (tmp_path / "rank.0.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("how", ["HVDKERAS_LOG_LEVEL=debug", "--log-level=info"])
def test_the_users_level_wins(how):
    env = _env_without_levels(**({"HVDKERAS_LOG_LEVEL": "debug"} if how.startswith("HVD")
                                 else {}))
    flags = ["--log-level", "info"] if how.startswith("--") else []
    result = _run_clean([BIN / "hvdkerasrun", "-np", "2", *flags, sys.executable, "-c", IMPORT_TF],
                        env)
    assert result.returncode == 0, describe(result)
    shown = _noise_in(result.stdout)
    assert any(line.startswith("[0]<stderr>: ") for line in shown), describe(result)
    assert any(line.startswith("[1]<stderr>: ") for line in shown), describe(result)


@pytest.mark.slow
@pytest.mark.light  # one process
@pytest.mark.timeout(TIMEOUT + 60)
def test_hvdkeras_check_prints_no_startup_lines_unless_asked():
    quiet = _run_clean([BIN / "hvdkeras", "check"], _env_without_levels())
    assert quiet.returncode == 0, describe(quiet)
    assert quiet.stdout.startswith("hvdkeras:"), describe(quiet)
    assert _noise_in(quiet.stdout) == [], describe(quiet)
    loud = _run_clean([BIN / "hvdkeras", "--log-level", "info", "check"], _env_without_levels())
    assert loud.returncode == 0 and _noise_in(loud.stdout), describe(loud)


INIT = "import hvdkeras as hvd; hvd.init(); print('rank', hvd.rank())"


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_a_cpu_machine_hears_about_the_gpu_part_only_at_info_level():
    """With no GPU visible to TensorFlow, the GPU part's "no CUDA here" is
    the normal CPU case: silent by default, one line (rank 0) when asked."""
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees a GPU here: the notice is a warning then")
    quiet = _run_clean([BIN / "hvdkerasrun", "-np", "2", sys.executable, "-c", INIT],
                       _env_without_levels())
    assert quiet.returncode == 0, describe(quiet)
    assert "GPU part" not in quiet.stdout, describe(quiet)
    told = _run_clean([BIN / "hvdkerasrun", "-np", "2", "--log-level", "info", sys.executable,
                       "-c", INIT], _env_without_levels())
    assert told.returncode == 0, describe(told)
    from hvdkeras.engine import build, toolchain

    has_gpu_part = toolchain.read_build_info(build.ensure_built()).get("device") == "CUDA"
    assert told.stdout.count("[0]<stderr>: hvdkeras: the op library has its GPU part") == \
        int(has_gpu_part), describe(told)
    assert "[1]<stderr>: hvdkeras: the op library" not in told.stdout, describe(told)

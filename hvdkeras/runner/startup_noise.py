"""TensorFlow's start-up lines, kept off the terminal unless asked for.

Importing TensorFlow prints, on every rank and before any line of the
user's, what its C++ side says while loading: absl's "before
InitializeLog()" warning, the oneDNN notice, the CPU-instructions notice
and, on a machine without a GPU driver, a failed `cuInit` that reads like an
error. Those lines come out before absl's logging is set up, so
`TF_CPP_MIN_LOG_LEVEL` cannot hide them; here they are recognised by their
text.

Note [quiet start-up]
~~~~~~~~~~~~~~~~~~~~~
Unless the user asked for TensorFlow's logs with a log level of ours
(`--log-level` of `hvdkerasrun` and `hvdkeras`, `HVDKERAS_LOG_LEVEL`),
hvdkeras's commands and the ranks they launch drop the start-up lines above
from the terminal; launched ranks keep them in their `--output-dir` logs.
`TF_CPP_MIN_LOG_LEVEL` is left as the user set it, or set to 2 (errors only)
when unset: since it cannot hide the start-up lines, setting it (most often
to 2, to make TensorFlow quiet) must not turn their filter off. With our
log level set every line shows. The launcher sets the variables
(`quiet_env`), the rank shim filters the ranks' streams, the `hvdkeras`
command filters its own import of TensorFlow.

Pure apart from `filtered_stderr`; imports only the standard library (the
launcher and the rank shim use it).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator, Mapping

TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
HVDKERAS_LOG_LEVEL = "HVDKERAS_LOG_LEVEL"
# Set in the ranks' environment when hvdkeras chose the quiet default; the
# rank shim filters their streams when it sees it.
QUIET_ENV = "HVDKERAS_QUIET_STARTUP"
QUIET_TF_LEVEL = "2"

# A glog-style line: severity, date, time, thread, file:line].
_GLOG = r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+"
_NOISE = [re.compile(p) for p in (
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    _GLOG + r"port\.cc:\d+\] oneDNN custom operations are on\.",
    _GLOG + r"cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized",
    r"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler "
    r"flags\.$",
    # No GPU driver: the CUDA build of TensorFlow says so as errors.
    _GLOG + r"cuda_platform\.cc:\d+\] failed call to cuInit:",
    _GLOG + r"cuda_executor\.cc:\d+\] .*(kernel driver|no NVIDIA GPU)",
    _GLOG + r"cudart_stub\.cc:\d+\] Could not find cuda drivers",
    _GLOG + r"cuda_(fft|dnn|blas)\.cc:\d+\] Unable to register cu(FFT|DNN|BLAS) factory",
    _GLOG + r"computation_placer\.cc:\d+\] computation placer already registered",
)]


def is_startup_noise(line: str) -> bool:
    """Whether `line` (with or without its newline) is one of TensorFlow's
    start-up lines that hvdkeras hides by default. Pure.

    Example:

    >>> is_startup_noise("WARNING: All log messages before absl::InitializeLog() "
    ...                  "is called are written to STDERR\\n")
    True
    >>> is_startup_noise("Epoch 1/3")
    False
    """
    text = line.rstrip("\r\n")
    return any(p.search(text) for p in _NOISE)


def quiet_env(environ: Mapping[str, str]) -> dict:
    """The variables that make a process quiet by default, or {} when the user
    asked for every line with our log level. A `TF_CPP_MIN_LOG_LEVEL` the
    user set is kept. Pure.

    >>> quiet_env({})
    {'HVDKERAS_QUIET_STARTUP': '1', 'TF_CPP_MIN_LOG_LEVEL': '2'}
    >>> quiet_env({"TF_CPP_MIN_LOG_LEVEL": "2"})
    {'HVDKERAS_QUIET_STARTUP': '1'}
    >>> quiet_env({"HVDKERAS_LOG_LEVEL": "debug"})
    {}
    """
    if environ.get(HVDKERAS_LOG_LEVEL, "").strip():
        return {}
    env = {QUIET_ENV: "1"}
    if not environ.get(TF_LOG_LEVEL, "").strip():
        env[TF_LOG_LEVEL] = QUIET_TF_LEVEL
    return env


def quiet_requested(environ: Mapping[str, str]) -> bool:
    """Whether hvdkeras chose the quiet default for this process. Pure."""
    return environ.get(QUIET_ENV) == "1"


@contextlib.contextmanager
def filtered_stderr(active: bool = True) -> Iterator[None]:
    """While inside, what this process writes to file descriptor 2 (C++
    included) is held back; on leaving it is written out without the
    start-up lines. For short stretches only (importing TensorFlow), since
    nothing shows until the end. Does nothing when `active` is false."""
    if not active:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(True)
                    if not is_startup_noise(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()

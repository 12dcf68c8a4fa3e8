"""TensorFlow's compiler and linker flags for custom ops, read without
importing TensorFlow into this process.

Note [the engine without TensorFlow in the process]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The engine and the TensorFlow binding are built together, with TensorFlow's
ABI flags, so the build key depends on them. Under the torch and jax
backends nothing else in a rank needs TensorFlow: importing it there only
costs seconds, memory, its own thread pools and start-up log lines. So when
TensorFlow is not imported already, its flags come from a record cached per
TensorFlow installation (its location and the size and modification time of
its files); the first process without a record runs one short Python
subprocess that imports TensorFlow and writes the record atomically, under a
file lock, so the ranks of a job ask only once. When TensorFlow is already
imported the flags are read from it directly; both ways give the same values
(both pass through JSON), hence the same build key.

What may import this module: the rest of `hvdkeras.engine`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from hvdkeras.engine.file_lock import exclusive_lock

_PROBE_SECONDS = 600
_MARKER = "HVDKERAS_TF_FLAGS="
# Files whose change means another TensorFlow build sits at the same place.
_FINGERPRINT_FILES = ("__init__.py", "libtensorflow_framework.so.2", "libtensorflow_cc.so.2")
# The child reads the flags with this module's own `_from_imported`.
_PROBE = (
    "import json, tensorflow\n"
    "from hvdkeras.engine import tf_flags\n"
    f"print({_MARKER!r} + json.dumps(tf_flags._from_imported()))\n"
)


class TensorFlowMissing(RuntimeError):
    """TensorFlow is not installed, or could not be imported to read its flags."""


def _normalized(record: Dict[str, Any]) -> Dict[str, Any]:
    return json.loads(json.dumps(record, default=str))


def _from_imported() -> Dict[str, Any]:
    tf = sys.modules["tensorflow"]
    s = tf.sysconfig
    return _normalized({"version": tf.__version__, "compile_flags": list(s.get_compile_flags()),
                        "link_flags": list(s.get_link_flags()),
                        "build_info": dict(s.get_build_info()), "include": s.get_include()})


def installation_fingerprint() -> Optional[str]:
    """A short hash naming the installed TensorFlow (None when there is none),
    found without importing it."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    package = Path(list(spec.submodule_search_locations)[0]).resolve()
    digest = hashlib.sha256(str(package).encode())
    for name in _FINGERPRINT_FILES:
        try:
            stat = (package / name).stat()
        except OSError:
            continue
        digest.update(f"\0{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def probe_in_subprocess(timeout: float = _PROBE_SECONDS) -> Dict[str, Any]:
    """Imports TensorFlow in a child Python and returns its flags."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    try:
        result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                                timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise TensorFlowMissing(f"importing TensorFlow to read its build flags took over "
                                f"{timeout:.0f} s") from exc
    lines = [line for line in result.stdout.splitlines() if line.startswith(_MARKER)]
    if result.returncode != 0 or not lines:
        raise TensorFlowMissing("TensorFlow could not be imported to read its build flags "
                                f"(exit code {result.returncode}):\n{result.stderr[-2000:]}")
    return _normalized(json.loads(lines[-1][len(_MARKER):]))


def _write_atomically(path: Path, record: Dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staged = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(record, handle, sort_keys=True)
    os.chmod(staged, 0o644)
    os.replace(staged, path)


def tensorflow_flags(cache_dir: Path) -> Dict[str, Any]:
    """TensorFlow's `version`, `compile_flags`, `link_flags`, `build_info` and
    `include` (Note [the engine without TensorFlow in the process]).

    Args:
        cache_dir: Where the per-installation records live.

    Returns:
        The record, with JSON types only.

    Example:
        >>> tensorflow_flags(Path("~/.cache/hvdkeras/toolchain").expanduser())["version"]
        '2.21.0'
    """
    if "tensorflow" in sys.modules:
        return _from_imported()
    fingerprint = installation_fingerprint()
    if fingerprint is None:
        raise TensorFlowMissing(
            "TensorFlow is not installed: hvdkeras builds its engine and TensorFlow binding "
            "with TensorFlow's compiler flags under every Keras backend. Install it: "
            "`pip install tensorflow`.")
    record_path = Path(cache_dir) / f"tensorflow-{fingerprint}.json"
    if not record_path.is_file():
        with exclusive_lock(record_path.with_suffix(".lock")):
            if not record_path.is_file():
                _write_atomically(record_path, probe_in_subprocess())
    return json.loads(record_path.read_text())

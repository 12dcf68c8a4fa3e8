"""TensorFlow's build flags read without importing TensorFlow
(hvdkeras.engine.tf_flags, Note [the engine without TensorFlow in the
process]): the cached record equals what TensorFlow says in-process, so the
build key is the same either way; it is asked for once per installation."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hvdkeras.engine import tf_flags, toolchain

# One process each (the `light` marker: pyproject.toml).
pytestmark = pytest.mark.light

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # a Python subprocess (most import TensorFlow)
def test_subprocess_probe_equals_the_imported_tensorflow():
    import tensorflow  # noqa: F401  (the in-process side of the comparison)

    assert tf_flags.probe_in_subprocess() == tf_flags._from_imported()


@pytest.mark.slow  # a Python subprocess (most import TensorFlow)
def test_record_is_written_once_and_reused_without_importing_tensorflow(tmp_path: Path):
    child = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from hvdkeras.engine import tf_flags
        first = tf_flags.tensorflow_flags(Path({str(tmp_path)!r}))
        def no_second_probe(*args, **kwargs):
            raise AssertionError("probed again")
        tf_flags.probe_in_subprocess = no_second_probe
        assert tf_flags.tensorflow_flags(Path({str(tmp_path)!r})) == first
        print("imported", "tensorflow" in sys.modules, "version", first["version"])
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                            timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    import tensorflow as tf

    assert result.stdout.split() == ["imported", "False", "version", tf.__version__]
    records = list(tmp_path.glob("tensorflow-*.json"))
    assert [r.name for r in records] == [f"tensorflow-{tf_flags.installation_fingerprint()}.json"]
    assert json.loads(records[0].read_text()) == tf_flags._from_imported()


@pytest.mark.slow  # a Python subprocess (most import TensorFlow)
def test_build_inputs_are_the_same_with_and_without_tensorflow_imported(tmp_path: Path):
    child = ("import json; from hvdkeras.engine import toolchain; "
             "print(json.dumps(toolchain.build_inputs(), sort_keys=True))")
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                            timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    import tensorflow  # noqa: F401

    without = json.loads(result.stdout.strip().splitlines()[-1])
    assert toolchain.cache_key(without) == toolchain.cache_key(toolchain.build_inputs())


def test_missing_tensorflow_is_a_clear_build_error(monkeypatch: pytest.MonkeyPatch):
    # Stand-in (pure logic): TensorFlow is installed here, so its absence is
    # simulated by hiding the module and its installation.
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(tf_flags, "installation_fingerprint", lambda: None)
    with pytest.raises(toolchain.BuildError, match=r"pip install tensorflow"):
        toolchain._tensorflow_flags()


@pytest.mark.slow  # a Python subprocess (most import TensorFlow)
def test_a_failing_probe_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tf_flags, "_PROBE", "raise SystemExit('no TensorFlow here')")
    with pytest.raises(tf_flags.TensorFlowMissing, match="no TensorFlow here"):
        tf_flags.probe_in_subprocess()

#!/usr/bin/env bash
# Create (if missing) the project's virtual environment and install hvdkeras
# into it in editable mode with the test, spark, tensorboard, docs and gpu
# extras (the gpu extra's
# CUDA runtime, NVRTC and NCCL let the op library's GPU part load and compile
# its kernels here, though this machine has no GPU), then the torch and jax
# extras (the other Keras backends' tests) and the ray extra, whose failures
# only make those tests skip with the reason. Safe to run
# repeatedly: the install step is skipped while pyproject.toml and setup.py are
# unchanged.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

PYTHON="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup_env: creating virtual environment $VENV" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --upgrade pip >&2
fi

STAMP="$VENV/.hvdkeras-install-stamp"
WANTED="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANTED" ]] \
   || ! "$VENV/bin/python" -I -c "import importlib.util as u, sys; sys.exit(u.find_spec('hvdkeras') is None)" >/dev/null 2>&1; then
  echo "setup_env: installing hvdkeras (editable, with the test, spark, tensorboard," \
       "docs and gpu extras)" >&2
  "$VENV/bin/python" -m pip install -e ".[test,spark,tensorboard,docs,gpu]" >&2
  for backend in torch jax; do
    "$VENV/bin/python" -m pip install -e ".[$backend]" >&2 \
      || echo "setup_env: the $backend extra could not be installed; its tests will skip" >&2
  done
  "$VENV/bin/python" -m pip install -e ".[ray]" >&2 \
    || echo "setup_env: the ray extra could not be installed; the Ray tests will skip" >&2
  echo "$WANTED" > "$STAMP"
fi
echo "$VENV"

#!/usr/bin/env bash
# Create (if missing) the project's virtual environment and install hvdkeras
# into it in editable mode with the test, spark, tensorboard, docs and gpu
# extras (the gpu extra's CUDA runtime, NVRTC and NCCL let the op library's
# GPU part load and compile its kernels here, though this machine has no
# GPU), and the torch, jax and ray extras (the other Keras backends' and the
# Ray tests), whose failures only make those tests skip with the reason.
# Safe to run repeatedly: the install step is skipped while pyproject.toml
# and setup.py are unchanged.
# --core: hvdkeras and its own dependencies only (TensorFlow, Keras, MPI),
# what the main job needs (scripts/demo.sh); a later full run adds the rest
# to the same environment.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

CORE=0
if [[ "${1:-}" == "--core" ]]; then CORE=1; fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup_env: creating virtual environment $VENV" >&2
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --upgrade pip >&2
fi

STAMP="$VENV/.hvdkeras-install-stamp"
CORE_STAMP="$VENV/.hvdkeras-core-install-stamp"
WANTED="$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
if [[ $CORE == 1 ]]; then
  if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANTED" ]] \
     && [[ ! -f "$CORE_STAMP" || "$(cat "$CORE_STAMP")" != "$WANTED" ]]; then
    echo "setup_env: installing hvdkeras (editable, its own dependencies only)" >&2
    "$VENV/bin/python" -m pip install -e . >&2
    echo "$WANTED" > "$CORE_STAMP"
  fi
  echo "$VENV"
  exit 0
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANTED" ]] \
   || ! "$VENV/bin/python" -I -c "import importlib.util as u, sys; sys.exit(u.find_spec('hvdkeras') is None)" >/dev/null 2>&1; then
  echo "setup_env: installing hvdkeras (editable, with the test, spark, tensorboard," \
       "docs, gpu, torch, jax and ray extras)" >&2
  # PyTorch's CPU build only: its default build from PyPI brings CUDA 13 wheels
  # whose nvidia/nccl replaces the NCCL that the op library's GPU part compiles
  # against. HVDKERAS_TORCH_SPEC names another CPU build (found through pip's
  # configured indexes and wheel directories); without one the torch tests skip.
  torch_spec="${HVDKERAS_TORCH_SPEC:-torch==2.13.0+cpu}"
  required="test,spark,tensorboard,docs,gpu"
  # Everything in one resolution (138 s on a clean clone here, against 184 s
  # for the steps below); where that fails, the required extras first and
  # then each optional one on its own, so one that cannot be installed only
  # makes its tests skip.
  if ! "$VENV/bin/python" -m pip install -e ".[$required,torch,jax,ray]" \
      "$torch_spec" >&2; then
    echo "setup_env: installing everything at once failed; installing the extras one by one" >&2
    "$VENV/bin/python" -m pip install -e ".[$required]" >&2
    "$VENV/bin/python" -m pip install "$torch_spec" >&2 \
      && "$VENV/bin/python" -m pip install -e ".[torch]" >&2 \
      || echo "setup_env: no CPU build of torch could be installed; the torch tests will skip" >&2
    "$VENV/bin/python" -m pip install -e ".[jax]" >&2 \
      || echo "setup_env: the jax extra could not be installed; the jax tests will skip" >&2
    "$VENV/bin/python" -m pip install -e ".[ray]" >&2 \
      || echo "setup_env: the ray extra could not be installed; the Ray tests will skip" >&2
  fi
  echo "$WANTED" > "$STAMP"
fi
# System packages for the tests, installed only as root with apt; without
# them those tests skip, saying why: Debian's Slurm and munge (the cluster
# tests, tests/test_slurm_cluster.py) and clang (the engine built with a
# second compiler, tests/test_device_collectives.py).
if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
  packages=()
  { command -v slurmctld && command -v munged; } >/dev/null 2>&1 || packages+=(slurm-wlm munge)
  command -v clang++ >/dev/null 2>&1 || packages+=(clang)
  if [[ ${#packages[@]} -gt 0 ]]; then
    echo "setup_env: installing ${packages[*]} for the tests" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${packages[@]}" >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q "${packages[@]}" >&2; } \
      || echo "setup_env: ${packages[*]} could not be installed; the tests that need" \
              "them will skip" >&2
  fi
fi
echo "$VENV"

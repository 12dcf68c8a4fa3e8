#!/usr/bin/env bash
# Downloads, into build/device_wheels (git ignores build/), the wheels that a
# lent GPU machine lacks for hvdkeras's torch and JAX paths: Keras and its
# dependencies, and hvdkeras's own small ones. Those machines have PyTorch,
# JAX, mpi4py and numpy but no network and no Keras; the device tool carries
# this folder there (about 31 MB, under its 64 MiB limit), and
# scripts/gpu_check.sh unpacks the ones that fit its Python
# (scripts/unpack_wheels.py). Binary wheels come for CPython 3.10 to 3.13.
#
#   bash scripts/device_wheels.sh    # then: device run with carry build/device_wheels
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/_env.sh
OUT=build/device_wheels
mkdir -p "$OUT"
PIP=("$VENV/bin/python" -m pip download -q --no-deps -d "$OUT")
# Keras at the main environment's version, and its pure-Python dependencies.
keras_version="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("keras"))')"
"${PIP[@]}" "keras==$keras_version" namex rich absl-py markdown-it-py mdurl pygments packaging \
  typing-extensions cloudpickle nvidia-ml-py
for python in 310 311 312 313; do
  "${PIP[@]}" --only-binary=:all: --python-version "$python" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    optree h5py ml_dtypes pyyaml
done
du -sh "$OUT"

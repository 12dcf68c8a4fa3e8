#!/usr/bin/env bash
# The TensorFlow version leg: hvdkeras on every TensorFlow minor version it
# supports besides the main environment's (2.21), each in a virtual
# environment of its own. On each version:
#   - the op library builds for it (the first test builds it);
#   - the collectives pass on 2 ranks (every tests/parallel/ file);
#   - a 2-rank model.fit equals one process on the global batch
#     (tests/keras_parallel/test_equivalence.py);
#   - the element types and engine settings agree between Python, the
#     library and the registered ops (test_vocabulary, test_engine_settings).
# TensorFlow 2.17.1 also gets tensorflow-io 0.37.1 (its newest release, which
# runs only on TensorFlow 2.16-2.17) and trains the Parquet recipe for real.
# This leg builds the CPU-only op library (HVDKERAS_CUDA=0), which is what
# every TensorFlow without CUDA gets; the main leg builds the GPU part.
#
#   scripts/test_tf_versions.sh [VERSION ...]   (default: the versions below)
#
#   HVDKERAS_TF_VENVS   where the environments live (default build/, which
#                       git ignores): build/venv-tf<VERSION>
#   HVDKERAS_TF_VENVS_KEEP  1 (default) keeps each environment for the next
#                       run; 0 removes it once its tests ran, so the leg needs
#                       disk for two environments (about 5 GB: the next one is
#                       made while this one's tests run) instead of five
#                       (about 11 GB). .ci/run sets 0: a clean clone never
#                       reuses them.
#   HVDKERAS_TF_VENV_MIN_FREE_GB  free disk needed before an environment is
#                       created (default 4); less fails that version at once with a message
#                       instead of pip running out of space half-way.
# Extra pytest arguments can be given after "--".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
export HVDKERAS_CUDA=0

DEFAULT_VERSIONS=(2.16.2 2.17.1 2.18.1 2.19.1 2.20.0)
VENVS="${HVDKERAS_TF_VENVS:-build}"
case "$VENVS" in
  /*) ;;
  *) VENVS="$REPO_ROOT/$VENVS" ;;
esac
PYTHON="${PYTHON:-python3}"
KEEP="${HVDKERAS_TF_VENVS_KEEP:-1}"
MIN_FREE_GB="${HVDKERAS_TF_VENV_MIN_FREE_GB:-4}"

versions=()
while [[ $# -gt 0 && "$1" != "--" ]]; do versions+=("$1"); shift; done
[[ $# -gt 0 ]] && shift  # the "--"
[[ ${#versions[@]} -gt 0 ]] || versions=("${DEFAULT_VERSIONS[@]}")

# What each version's environment needs besides hvdkeras[test] and TensorFlow.
extra_pins() {
  case "$1" in
    # pyarrow is only for the tests (writing Parquet files); < 20 still
    # supports numpy 1.x, which TensorFlow 2.17 needs.
    2.17.*) echo "tensorflow-io==0.37.1 pyarrow>=14,<20" ;;
    *) echo "" ;;
  esac
}

# Tests every version runs (a -k expression over these files).
COMMON_FILES=(tests/test_vocabulary.py tests/test_engine_settings.py
              tests/test_collectives_mpi.py tests/test_keras_mpi.py)
COMMON_SELECTION="test_vocabulary or test_engine_settings or np2 or test_equivalence"
# ...and the tests only the tensorflow-io version runs.
IO_FILES=(tests/test_recipes_io.py tests/test_recipes_schema.py tests/test_recipes_data.py)

# prepare VERSION: make (or reuse) the version's environment with hvdkeras[test]
# installed. Writes what pip says to stderr; fails when pip or the disk check does.
prepare() {
  local version=$1 venv="$VENVS/venv-tf$1" pins stamp wanted free_kb
  read -r -a pins <<< "tensorflow==$version $(extra_pins "$version")"
  if [[ ! -x "$venv/bin/python" ]]; then
    mkdir -p "$VENVS"
    free_kb=$(df -Pk "$VENVS" | awk 'NR==2 {print $4}')
    if (( free_kb < MIN_FREE_GB * 1024 * 1024 )); then
      echo "tf-versions: only $((free_kb / 1024)) MB free under $VENVS; an environment" \
           "needs about ${MIN_FREE_GB} GB. Free disk, or remove old environments there" \
           "(or set HVDKERAS_TF_VENVS_KEEP=0 so each is removed after its tests)." >&2
      return 1
    fi
    echo "tf-versions: creating $venv" >&2
    "$PYTHON" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
  fi
  stamp="$venv/.hvdkeras-install-stamp"
  wanted="$( (cat pyproject.toml setup.py; printf '%s\n' "${pins[@]}") | sha256sum | cut -d' ' -f1)"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    echo "tf-versions: installing hvdkeras[test] with ${pins[*]}" >&2
    "$venv/bin/python" -m pip install -q -e ".[test]" "${pins[@]}" >&2
    echo "$wanted" > "$stamp"
  fi
}

# The next version's environment is prepared in the background while this
# version's tests run: pip mostly waits on the network and the disk, the
# tests on the cores, so the leg takes about the tests' time plus the first
# environment's instead of the sum of both (two environments on disk at once).
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
start_preparing() {
  prepare "$1" > "$logs/$1.log" 2>&1 &
  echo $! > "$logs/$1.pid"
}

overall=0
start_preparing "${versions[0]}"
for i in "${!versions[@]}"; do
  version=${versions[$i]}
  venv="$VENVS/venv-tf$version"
  started=$SECONDS
  prepared=0
  wait "$(cat "$logs/$version.pid")" || prepared=$?
  cat "$logs/$version.log" >&2
  installed=$SECONDS
  if (( i + 1 < ${#versions[@]} )); then
    start_preparing "${versions[$((i + 1))]}"
  fi
  if [[ $prepared -ne 0 ]]; then
    echo "tf-versions: TensorFlow $version: its environment could not be made (exit $prepared)" >&2
    overall=1
    [[ "$KEEP" == "0" ]] && rm -rf "$venv"
    continue
  fi
  status=0
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "${COMMON_FILES[@]}" \
    -k "$COMMON_SELECTION" "$@" || status=$?
  if [[ $status -eq 0 && -n "$(extra_pins "$version")" ]]; then
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${IO_FILES[@]}" "$@" || status=$?
  fi
  [[ $status -eq 5 ]] && echo "tf-versions: pytest collected no tests for $version" >&2
  echo "tf-versions: TensorFlow $version: exit $status; waited $((installed - started)) s" \
       "for its environment, tests $((SECONDS - installed)) s" >&2
  [[ $status -eq 0 ]] || overall=1
  if [[ "$KEEP" == "0" ]]; then
    rm -rf "$venv"
  fi
done
exit "$overall"

#!/usr/bin/env bash
# Set up the environment, then run the test suite. Extra arguments go to pytest.
# --quick (first argument): the fast contributor loop instead of the whole suite.
# Fails when pytest fails and also when it collects no tests (exit code 5).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

bash scripts/setup_env.sh >/dev/null
# The suite runs on the op library with its GPU part, which must build, load
# and pass here although this machine has no GPU: without an NVIDIA driver
# the automatic choice leaves the GPU part out (the demo's build) unless told
# to take the machine as if it had one.
export HVDKERAS_CUDA_WITHOUT_DRIVER="${HVDKERAS_CUDA_WITHOUT_DRIVER:-1}"

if [[ "${1:-}" == "--quick" ]]; then
  # The contributor loop (README, "Contributing"): the tests that launch no
  # job and compile nothing, then one 2-rank smoke job per area, each under a
  # timeout: the collectives (and those of the torch backend), Keras
  # training (stage 0 and sharded state), a recipe through `hvdkeras train`.
  # Under 3 minutes once the environment and the op library exist. CI runs
  # everything (no argument).
  shift
  # The ranks' start-up as in the suite's jobs (Note [lean imports in
  # launched processes] in tests/mpi_runner.py).
  lean="PYTHONPATH=$PWD/tests/lean_imports${PYTHONPATH:+:$PYTHONPATH}"
  "$VENV/bin/python" -m pytest tests -q -m "not slow" -p no:cacheprovider "$@"
  env "$lean" HVDKERAS_UNDER_MPI=1 HVDKERAS_EXPECTED_SIZE=2 timeout 300 "$VENV/bin/mpiexec" -n 2 \
    "$VENV/bin/python" -m pytest -q -x -p no:cacheprovider tests/parallel/test_allreduce.py \
    tests/parallel/test_broadcast.py tests/parallel/test_gather_scatter.py
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider -k "torch and on_two_ranks" \
    tests/test_backends_smoke.py
  env "$lean" HVDKERAS_UNDER_MPI=1 HVDKERAS_EXPECTED_SIZE=2 timeout 300 "$VENV/bin/mpiexec" -n 2 \
    "$VENV/bin/python" -m pytest -q -x -p no:cacheprovider -W ignore::DeprecationWarning \
    tests/keras_parallel/test_equivalence.py tests/keras_parallel/test_zero_training.py
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_recipes_mpi.py::test_tabular_mlp_short_with_overrides_and_engine_knobs
  echo "test.sh: quick loop finished in ${SECONDS}s" >&2
  exit 0
fi

status=0
# The main leg is the CUDA leg: the main environment's TensorFlow is a CUDA
# build with CUDA headers, so the op library is built with its GPU part
# (ops/cuda/), which must compile, link, load on this GPU-less machine and pass
# the whole suite as a CPU build. HVDKERAS_REQUIRE_CUDA_BUILD=1 turns a silent
# fallback to a CPU-only build into a failure (tests/test_cuda_build.py).
# --durations: the slowest tests are listed in every run's log, so the cost
# of the budget below is visible where it is spent.
export HVDKERAS_REQUIRE_CUDA_BUILD="${HVDKERAS_REQUIRE_CUDA_BUILD:-1}"
main=(tests -q -p no:cacheprovider --ignore=tests/test_backends.py)
# With 4 or more cores, two pytest sessions at once: the tests that keep
# about one core busy or less (marker `light`, and every test not marked
# slow: one process, or ranks that mostly wait out a bound) beside the rest.
# Not on 2 cores: there the suite alone used 1.5 of them on average, yet
# with the light session beside it the other session's 2-rank jobs (whose
# ranks wait on each other) slowed by as much as the light tests took out
# (docs/testing.md has the numbers).
# HVDKERAS_LIGHT_BESIDE=1 or 0 forces it on or off.
beside="${HVDKERAS_LIGHT_BESIDE:-auto}"
if [[ "$beside" == "auto" ]]; then
  beside=0
  if [[ "$(nproc)" -ge 4 ]]; then beside=1; fi
fi
if [[ "$beside" == "1" ]]; then
  # The op library is built first, so neither session waits on the other's
  # build lock.
  "$VENV/bin/python" -c "from hvdkeras.engine import build; build.ensure_built(verbose=False)"
  light_log="$(mktemp)"
  "$VENV/bin/python" -m pytest "${main[@]}" --durations=10 \
    -m "(not slow or light) and not extended" "$@" \
    > "$light_log" 2>&1 &
  light_pid=$!
  "$VENV/bin/python" -m pytest "${main[@]}" --durations=30 \
    -m "slow and not light and not extended" "$@" \
    || status=$?
  light_status=0
  wait "$light_pid" || light_status=$?
  echo "test.sh: the light tests, run beside the others (exit status $light_status):"
  cat "$light_log"
  rm -f "$light_log"
  # 5 is pytest's "collected nothing": with arguments one session may select
  # nothing, which is fine as long as the other ran something.
  if [[ $status -eq 5 || ( $status -eq 0 && $light_status -ne 5 ) ]]; then
    status=$light_status
  fi
else
  "$VENV/bin/python" -m pytest "${main[@]}" --durations=30 -m "not extended" "$@" \
    || status=$?
fi
if [[ $status -eq 5 ]]; then
  echo "test.sh: pytest collected no tests; treating that as a failure" >&2
fi

# The legs after the main suite. Each runs after a passing main suite given
# no pytest arguments, when the time used so far plus the leg's allowance
# stays within the CI budget (HVDKERAS_CI_BUDGET_SECONDS, default 4800: a
# default CI run runs every leg, about 70 minutes on this project's 2-core
# machine, and a leg skips itself, saying so, only where a slow machine
# would otherwise pass 80 minutes, well inside CI's 90-minute limit). Its
# switch variable =1 forces it, =0 skips it; its _SECONDS variable sets its
# allowance.
pytest_args=$#
# leg_has_room WHAT SWITCH_VARIABLE ALLOWANCE_VARIABLE DEFAULT_ALLOWANCE
leg_has_room() {
  local what=$1 switch="${!2:-auto}" allowance="${!3:-$4}"
  local budget="${HVDKERAS_CI_BUDGET_SECONDS:-4800}"
  [[ $status -eq 0 && "$switch" != "0" ]] || return 1
  if [[ "$switch" == "1" ]] \
     || [[ $pytest_args -eq 0 && $((SECONDS + allowance)) -le $budget ]]; then
    return 0
  fi
  echo "test.sh: skipping $what (pytest arguments given, or ${SECONDS}s used +" \
       "${allowance}s would pass the ${budget}s budget); $2=1 forces it" >&2
  return 1
}

# Second leg: the tests marked `extended` (pyproject.toml: slow variants of
# what the main suite covers: the CPU-only build, two shared-memory allreduce
# paths at 2 ranks, ResNet-50 through a recipe, a fit on 2x2 simulated
# hosts; 133-381 s in clean-clone runs here). Allowance 400 s: the leg with
# room for a slow day, so that running it never takes CI past the budget.
if leg_has_room "the extended leg" HVDKERAS_EXTENDED_LEG HVDKERAS_EXTENDED_LEG_SECONDS 400; then
  "$VENV/bin/python" -m pytest tests -q -p no:cacheprovider -m extended --durations=10 \
    || status=$?
fi

# Third leg: the other Keras backends (tests/test_backends.py: torch and jax at
# 2 and 3 ranks, sharded optimizer state included, the quickstart and a
# recipe under each; 456-827 s in clean-clone runs here; the main suite runs
# their collectives on 2 ranks, tests/test_backends_smoke.py). Allowance
# 900 s: room for a slow day, so that running it never takes CI past the
# budget.
if leg_has_room "the backends leg" HVDKERAS_BACKENDS_LEG HVDKERAS_BACKENDS_LEG_SECONDS 900; then
  "$VENV/bin/python" -m pytest tests/test_backends.py -q -rs --durations=15 || status=$?
fi

# Fourth leg: every other TensorFlow minor version hvdkeras supports, each in
# its own environment, with the CPU-only op library (scripts/test_tf_versions.sh:
# it builds, the collectives on 2 ranks, a model.fit equivalence, and on
# 2.17.1 the Parquet recipe through tensorflow-io). Allowance 800 s: each
# version's tests take 85-150 s and each environment 35-55 s (pip), made
# while the previous version's tests run, so the leg takes about the tests'
# time plus one environment's (638 s for the five in a clean-clone CI run on
# 2026-11-28, when the environments were still made one after the other).
if leg_has_room "the TensorFlow versions leg" HVDKERAS_TF_VERSIONS_LEG \
    HVDKERAS_TF_VERSIONS_LEG_SECONDS 800; then
  bash scripts/test_tf_versions.sh || status=$?
fi
echo "test.sh: finished in ${SECONDS}s" >&2
exit "$status"

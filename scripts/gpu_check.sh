#!/usr/bin/env bash
# The first thing to run on a lent GPU machine (one H100 or H200, 16 cores,
# no network), and to quote in full: every GPU check this project has, in
# one command, in under 8 minutes on one GPU (a few more with two or more),
# ending with a table.
#
#   bash scripts/gpu_check.sh
#
# On a machine without a GPU it says so in one line and exits 0. Logs go to
# $OUT/gpu_check (the device tool's folder that comes back) or
# /tmp/gpu_check. Steps that need TensorFlow (its op library) report SKIP
# with the reason where it is not installed: lent machines have had PyTorch
# and JAX but no TensorFlow, whose wheel is too large to carry there. There
# the engine is built alone and runs the torch and JAX steps, with Keras
# unpacked from build/device_wheels (scripts/device_wheels.sh makes it; the
# device tool carries it: `carry: ["build/device_wheels"]`); the CUDA device
# and NCCL check needs no framework.
# With two or more GPUs it also runs, under torch and JAX, what needs two:
# collectives and fit between GPUs, a rank failing before its NCCL call, a
# peer killed inside an allreduce, two communicators shut down in order; on
# one GPU those rows say SKIP with the reason (docs/gpus.md).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_check: no GPU on this machine (nvidia-smi lists none), so there is nothing to check"
  exit 0
fi

PY=python3
if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; fi
LOGS="${OUT:-/tmp}/gpu_check"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
# The NVIDIA wheels' library folders, for the CUDA device check's loader.
HVDKERAS_CUDA_LIBRARY_DIRS="$("$PY" - <<'EOF'
import glob, site, sys
dirs = []
for base in [*site.getsitepackages(), *sys.path]:
    dirs += glob.glob(f"{base}/nvidia/*/lib")
print(":".join(dict.fromkeys(dirs)))
EOF
)"
export HVDKERAS_CUDA_LIBRARY_DIRS

ROWS=()
# step NAME SECONDS COMMAND...: runs COMMAND with a bound, logs it, and adds
# a row with PASS/FAIL, the time and its last line.
step() {
  local name=$1 bound=$2
  shift 2
  local log="$LOGS/$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_').log"
  local began=$SECONDS
  echo "=== $name"
  timeout --kill-after=10 "$bound" "$@" >"$log" 2>&1
  local rc=$?
  local took=$((SECONDS - began))
  cat "$log"
  local verdict=PASS
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then verdict="FAIL (over ${bound} s)";
  elif [[ $rc -ne 0 ]]; then verdict="FAIL (exit $rc)"; fi
  local last
  last="$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-90)"
  ROWS+=("$(printf '%-44s | %-18s | %4ss | %s' "$name" "$verdict" "$took" "$last")")
}
skip() {
  ROWS+=("$(printf '%-44s | %-18s | %4ss | %s' "$1" "SKIP" 0 "$2")")
}

# Keras where the machine lacks it: the wheels scripts/device_wheels.sh put in
# build/device_wheels (carried there by the device tool), unpacked for this
# Python. hvdkeras itself runs from this checkout.
SITE="$LOGS/site"
if ! "$PY" -c "import keras" >/dev/null 2>&1 && [[ -d build/device_wheels ]]; then
  echo "=== Keras and hvdkeras's small dependencies from build/device_wheels"
  "$PY" scripts/unpack_wheels.py build/device_wheels "$SITE"
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
# A $CXX without a shared libstdc++ is refused by the build (it would put a
# second C++ runtime in the engine); here the system's g++ is used instead.
if [[ -n "${CXX:-}" ]] && ! "$PY" -c "import sys; from hvdkeras.engine.build import \
shared_cxx_runtime as s; sys.exit(not s(sys.argv[1]))" "$CXX" 2>/dev/null; then
  echo "gpu_check: CXX=$CXX has no shared libstdc++; building with g++ from PATH instead"
  unset CXX
fi
# Open MPI's mpiexec refuses root unless told (these machines run as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "=== the machine"
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
"$PY" - <<'EOF'
import importlib.util, sys
print("python", sys.version.split()[0])
for name in ("tensorflow", "keras", "torch", "jax", "mpi4py"):
    print(f"{name}: {'installed' if importlib.util.find_spec(name) else 'missing'}")
EOF
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }
# The mpiexec beside this Python (the mpich wheel's), else the system's.
MPIEXEC="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/mpiexec"
[[ -x "$MPIEXEC" ]] || MPIEXEC="$(command -v mpiexec || echo mpiexec)"

# 1. The CUDA device and NCCL, no framework: contexts, kernels and their
#    cache, stream priority, scaled copies, a one-rank NCCL communicator,
#    the fusion pack against a device-to-device copy.
step "build the CUDA device check" 300 "$PY" scripts/build_cuda_device_check.py "$LOGS/cuda_check"
if [[ -x "$LOGS/cuda_check/cuda_device_check" ]]; then
  rm -rf "$LOGS/kernel_cache"
  step "CUDA device, kernels, one-rank NCCL" 120 \
    "$LOGS/cuda_check/cuda_device_check" "$LOGS/kernel_cache"
else
  skip "CUDA device, kernels, one-rank NCCL" "the check did not build (see above)"
fi

if has tensorflow; then
  export HVDKERAS_STALL_SHUTDOWN_SECONDS=60
  # 2. The op library with its GPU part, forced: a CPU-only build fails here.
  step "forced CUDA build of the op library" 300 env HVDKERAS_CUDA=1 \
    HVDKERAS_REQUIRE_CUDA_BUILD=1 "$PY" -c \
    "from hvdkeras.engine import build; build.ensure_built(verbose=True)"
  step "hvdkeras check" 120 "$PY" -m hvdkeras.cli check
  # 3. CUDA contexts per process before and after pin_gpu().
  step "contexts before and after pin_gpu()" 120 "$PY" tests/scripts/gpu_contexts_job.py
  # 4. The one-rank GPU tests: kernels, stream order, XLA custom calls, NCCL.
  step "one-rank GPU tests" 300 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_gpu.py \
    -k "np1 or probe"
  # 5. What hvdkeras costs at one rank: ResNet-50 with and without it.
  for wrapped in 0 1; do
    step "ResNet-50 one GPU, DistributedOptimizer=$wrapped" 240 "$PY" \
      examples/synthetic_benchmark.py --model ResNet50 --batch-size 64 --num-iters 3 \
      --num-batches-per-iter 10 $([[ $wrapped == 0 ]] && echo --independent)
  done
  # 6. Two ranks on one GPU fail clearly, on both ranks.
  step "two ranks on one GPU fail clearly" 180 "$PY" tests/scripts/gpu_shared_job.py
  # 7. The 4 KB small-op benchmark, on this 16-core host.
  step "4 KB allreduce, 2 ranks (16-core host)" 240 "$MPIEXEC" -n 2 "$PY" \
    examples/allreduce_benchmark.py --sizes 4KB --repeat 3
else
  for what in "forced CUDA build of the op library" \
              "contexts before and after pin_gpu()" "one-rank GPU tests" \
              "ResNet-50 with and without hvdkeras" "4 KB allreduce (16-core host)"; do
    skip "$what" "TensorFlow is not installed here (these use its binding)"
  done
  # Without TensorFlow: the engine alone (Note [the engine alone] in
  # hvdkeras/engine/toolchain.py) under the backends that are here.
  export HVDKERAS_STALL_SHUTDOWN_SECONDS=60
  step "the engine alone, GPU part forced" 300 env HVDKERAS_CUDA=1 "$PY" -c \
    "from hvdkeras.engine import build, toolchain as t; p = build.ensure_engine_built(verbose=True); i = t.read_build_info(p); print(p); print(i['device'], i['cuda_reason'])"
  if has keras && has torch; then
    step "hvdkeras check (torch, no TensorFlow)" 120 env KERAS_BACKEND=torch \
      "$PY" -m hvdkeras.cli check
    step "torch collectives of CUDA tensors" 180 env KERAS_BACKEND=torch \
      "$PY" tests/scripts/gpu_torch_collectives_job.py
    step "two ranks on one GPU fail clearly (torch)" 180 env KERAS_BACKEND=torch \
      "$PY" tests/scripts/gpu_shared_job.py
  else
    skip "torch collectives of CUDA tensors" "Keras or PyTorch is not installed here"
  fi
fi
# One step of fit under torch and JAX with CUDA tensors (either engine).
if has keras; then
  for backend in torch jax; do
    if has "$backend"; then
      step "one fit step, $backend on the GPU" 180 env KERAS_BACKEND="$backend" \
        "$PY" tests/scripts/gpu_backend_fit_job.py
    else
      skip "one fit step, $backend on the GPU" "$backend is not installed"
    fi
  done
else
  skip "one fit step, torch and jax on the GPU" "Keras is not installed (scripts/device_wheels.sh)"
fi

# Between GPUs, without TensorFlow: at -n 2 and at -n (all GPUs), the exact
# collectives of CUDA tensors with the 64 MiB allreduce's bus bandwidth
# beside torch.distributed's, one fit step under torch and JAX; at -n 2 the
# failures only two GPUs can show (tests/scripts/gpu_two_rank_failures.py).
GPUS="$(nvidia-smi -L | grep -c '^GPU')"
if [[ $GPUS -ge 2 ]] && has keras && has torch && has mpi4py; then
  export HVDKERAS_STALL_SHUTDOWN_SECONDS=60
  for n in $(printf '%s\n' 2 "$GPUS" | sort -un); do
    step "torch collectives of CUDA tensors, -n $n" 240 env KERAS_BACKEND=torch \
      "$MPIEXEC" -n "$n" "$PY" tests/scripts/gpu_torch_collectives_job.py
    for backend in torch jax; do
      if has "$backend"; then
        step "fit, $backend on $n GPUs" 240 env KERAS_BACKEND="$backend" \
          "$MPIEXEC" -n "$n" "$PY" tests/scripts/gpu_backend_fit_job.py
      else
        skip "fit, $backend on $n GPUs" "$backend is not installed"
      fi
    done
  done
  for mode in lone-failure peer-death two-communicators; do
    step "two GPUs: $mode (torch)" 240 env KERAS_BACKEND=torch \
      "$PY" tests/scripts/gpu_two_rank_failures.py "$mode"
  done
else
  why="this machine has one GPU; these need two or more"
  [[ $GPUS -ge 2 ]] && why="Keras, PyTorch or mpi4py is missing here"
  for what in "torch collectives of CUDA tensors, -n 2 and all" \
              "fit under torch and jax, -n 2 and all" \
              "two GPUs: a lone failure, a peer killed, two communicators"; do
    skip "$what" "$why"
  done
fi

echo
echo "gpu_check: $(nvidia-smi -L | head -n 1), $((SECONDS)) s"
printf '%-44s | %-18s | %5s | %s\n' "check" "result" "time" "last line"
for row in "${ROWS[@]}"; do [[ -n "$row" ]] && echo "$row"; done
failed=0
for row in "${ROWS[@]}"; do [[ "$row" == *"| FAIL"* ]] && failed=1; done
exit $failed

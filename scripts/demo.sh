#!/usr/bin/env bash
# Set up the environment (hvdkeras and its core dependencies only), then run
# the main job: the digits recipe on 2 ranks,
#   hvdkeras train recipes/digits.yaml --np 2
# (a small CNN on the bundled 8x8 digits; >= 95% validation accuracy in well
# under 2 minutes on 2 CPU cores). Extra arguments go to `hvdkeras train`, e.g.
# --set training.epochs=3. Outputs go to runs/digits/; a second run resumes from
# its checkpoints (and has nothing left to train): delete runs/digits to start over.
# The two-rank collectives example is still there:
#   .venv/bin/mpiexec -n 2 .venv/bin/python examples/allreduce_demo.py
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

# Only what the main job needs: hvdkeras and TensorFlow, Keras and MPI.
# scripts/test.sh adds the test world (torch, JAX, Spark, Ray, Slurm) later.
bash scripts/setup_env.sh --core >/dev/null
exec "$VENV/bin/hvdkeras" train recipes/digits.yaml --np 2 "$@"

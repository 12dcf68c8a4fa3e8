#!/usr/bin/env bash
# Set up the environment, then run the two-rank allreduce example.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

bash scripts/setup_env.sh >/dev/null
exec "$VENV/bin/mpiexec" -n 2 "$VENV/bin/python" examples/allreduce_demo.py "$@"

#!/usr/bin/env bash
# Set up the environment, then run the test suite. Extra arguments go to pytest.
# Fails when pytest fails and also when it collects no tests (exit code 5).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

bash scripts/setup_env.sh >/dev/null
status=0
"$VENV/bin/python" -m pytest tests -q "$@" || status=$?
if [[ $status -eq 5 ]]; then
  echo "test.sh: pytest collected no tests; treating that as a failure" >&2
fi
exit "$status"

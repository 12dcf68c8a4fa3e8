#!/usr/bin/env bash
# Second CI leg: TensorFlow 2.17.1 + tensorflow-io 0.37.1 (the newest release,
# which runs only on TF 2.16-2.17), in its own virtual environment.
#
# Creates (if missing) the environment, installs hvdkeras editable with the
# [test,io] extras and the pinned TensorFlow, then runs the recipe tests there:
# the op library is built against TF 2.17 (the build follows the installed
# TensorFlow), Parquet files read through tensorflow-io, and the bundled
# Parquet recipe trains on 2 ranks. Extra arguments go to pytest.
#
#   HVDKERAS_TF217_VENV   where the environment lives (default build/venv-tf217,
#                         inside the git-ignored build/ directory)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

VENV217="${HVDKERAS_TF217_VENV:-build/venv-tf217}"
case "$VENV217" in
  /*) ;;
  *) VENV217="$REPO_ROOT/$VENV217" ;;
esac
PYTHON="${PYTHON:-python3}"
# pyarrow is only for the tests (writing Parquet files); < 20 still supports numpy 1.x,
# which TensorFlow 2.17 needs.
PINS=("tensorflow==2.17.1" "tensorflow-io==0.37.1" "pyarrow>=14,<20")

started=$SECONDS
if [[ ! -x "$VENV217/bin/python" ]]; then
  echo "test_tf217: creating virtual environment $VENV217" >&2
  "$PYTHON" -m venv "$VENV217"
  "$VENV217/bin/python" -m pip install -q --upgrade pip >&2
fi
STAMP="$VENV217/.hvdkeras-install-stamp"
WANTED="$( (cat pyproject.toml setup.py; printf '%s\n' "${PINS[@]}") | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANTED" ]]; then
  echo "test_tf217: installing hvdkeras[test,io] with ${PINS[*]}" >&2
  "$VENV217/bin/python" -m pip install -q -e ".[test,io]" "${PINS[@]}" >&2
  echo "$WANTED" > "$STAMP"
fi
echo "test_tf217: environment ready in $((SECONDS - started)) s" >&2

tests_started=$SECONDS
status=0
"$VENV217/bin/python" -m pytest -q -p no:cacheprovider \
  tests/test_recipes_io.py tests/test_recipes_schema.py tests/test_recipes_data.py "$@" || status=$?
echo "test_tf217: tests took $((SECONDS - tests_started)) s (leg total $((SECONDS - started)) s)" >&2
if [[ $status -eq 5 ]]; then
  echo "test_tf217: pytest collected no tests; treating that as a failure" >&2
fi
exit "$status"

# Sourced by the other scripts: sets REPO_ROOT and VENV (absolute) and cds to the repo root.
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
VENV="${HVDKERAS_VENV:-.venv}"
case "$VENV" in
  /*) ;;
  *) VENV="$REPO_ROOT/$VENV" ;;
esac

"""The variables through which a cluster engine's task (a Spark task, a Ray
actor) configures the rank it starts (`hvdkeras.cluster.job` sets them,
`hvdkeras.cluster.task_rank` reads them).

What may import this module: the rest of `hvdkeras.cluster` (standard library only).
"""

import os
import tempfile

ADDRESS_ENV = "HVDKERAS_TASK_SERVICE"  # host:port of the driver's service
# The path of a private file (mode 0600) holding the secret, in hex; the rank
# reads and removes it at start, so the secret itself is in no environment,
# command line or log.
SECRET_FILE_ENV = "HVDKERAS_TASK_SECRET_FILE"
INDEX_ENV = "HVDKERAS_TASK_INDEX"
SIZE_ENV = "HVDKERAS_TASK_SIZE"
START_TIMEOUT_ENV = "HVDKERAS_TASK_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 300.0


def write_secret_file(secret_hex: str) -> str:
    """Writes the secret to a new private file (0600) and returns its path."""
    fd, path = tempfile.mkstemp(prefix="hvdkeras-task-", suffix=".key")
    with os.fdopen(fd, "w") as f:
        f.write(secret_hex)
    return path


def take_secret(path: str) -> bytes:
    """Reads the secret from `path` and removes the file."""
    try:
        with open(path, encoding="ascii") as f:
            return bytes.fromhex(f.read().strip())
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass

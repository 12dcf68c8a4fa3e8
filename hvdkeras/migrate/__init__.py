"""`hvdkeras migrate`: rewriting a Horovod + Keras 2 training script for
hvdkeras + Keras 3 (`rewrite.migrate`), with syntax-aware edits (`edits`).

What may import it: the CLI and tests (standard library only).
"""

from hvdkeras.migrate.rewrite import Migration, migrate

__all__ = ["Migration", "migrate"]

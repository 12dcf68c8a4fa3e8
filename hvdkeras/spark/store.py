"""Horovod's `Store`: where a Spark estimator keeps its data copy, checkpoints and model.

What may import this module: the rest of `hvdkeras.spark` and the top-level
package. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import uuid
from urllib.parse import urlparse


class Store:
    """A directory every Spark task can read and write.

    Use `Store.create(path)`. hvdkeras stores on a filesystem path (local,
    or a shared mount such as NFS for a cluster); `hdfs://`, `s3://` and the
    like are not supported: mount them, or copy the data in first.

    Example:

    ```python
    store = Store.create("/mnt/shared/hvdkeras-runs")
    ```
    """

    def __init__(self, prefix_path: str) -> None:
        self.prefix_path = os.path.abspath(prefix_path)

    @classmethod
    def create(cls, prefix_path: str, *args, **kwargs) -> "Store":
        """A store under `prefix_path` (a directory path or a `file://` URL).

        Args:
            prefix_path: The directory (created if missing).
            *args, **kwargs: Horovod's extra store options (e.g. for HDFS),
                accepted for scripts that pass them; a local store needs none.

        Returns:
            The store.

        Raises:
            ValueError: for a remote URL (hdfs://, s3://, ...).
        """
        parsed = urlparse(os.fspath(prefix_path))
        if parsed.scheme not in ("", "file"):
            raise ValueError(f"Store.create({prefix_path!r}): hvdkeras stores on a filesystem "
                             "path every task can reach (local, or a shared mount); "
                             f"{parsed.scheme}:// is not supported.")
        path = parsed.path if parsed.scheme == "file" else os.fspath(prefix_path)
        os.makedirs(path, exist_ok=True)
        return cls(path)

    def new_run_id(self) -> str:
        return f"run-{uuid.uuid4().hex[:12]}"

    def get_run_path(self, run_id: str) -> str:
        return os.path.join(self.prefix_path, "runs", run_id)

    def get_train_data_path(self, run_id: str) -> str:
        return os.path.join(self.get_run_path(run_id), "train.parquet")

    def get_val_data_path(self, run_id: str) -> str:
        return os.path.join(self.get_run_path(run_id), "val.parquet")

    def get_checkpoint_path(self, run_id: str) -> str:
        """The trained model (a `.keras` file, written by rank 0)."""
        return os.path.join(self.get_run_path(run_id), "model.keras")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def remove_data(self, run_id: str) -> None:
        """Deletes a run's Parquet copies (the model stays)."""
        for path in (self.get_train_data_path(run_id), self.get_val_data_path(run_id)):
            shutil.rmtree(path, ignore_errors=True)


LocalStore = Store  # Horovod's name for the filesystem store

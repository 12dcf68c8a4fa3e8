"""Reading a recipe's data files without TensorFlow: the bundled digits, file
lists, compression, CSV columns, and the arithmetic of the validation split
and the shards (the pipelines in `hvdkeras.recipes.data` and the checks in
`hvdkeras.recipes.resolve` both use them).

What may import this module: the rest of `hvdkeras.recipes` (NumPy only).
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from hvdkeras.recipes.schema_data import BUNDLED_DATA_DIR

DIGITS_FILE = BUNDLED_DATA_DIR / "digits.csv.gz"
DIGITS_PARQUET = BUNDLED_DATA_DIR / "digits.parquet"
DIGITS_EXAMPLES = 1797  # rows of DIGITS_FILE (a test reads the file and checks)


class DataError(Exception):
    """The data could not be read as the recipe describes (message says why).

    `field` names the data key at fault ("label", "columns", ...) when known.
    """

    def __init__(self, message: str, field: Optional[str] = None) -> None:
        super().__init__(f"data.{field}: {message}" if field else message)
        self.field = field
        self.message = message


def load_digits() -> Tuple[np.ndarray, np.ndarray]:
    """The bundled digits: (pixels float32 of shape (1797, 64) in 0..16, labels int32)."""
    with gzip.open(DIGITS_FILE, "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return rows[:, :64].astype(np.float32), rows[:, 64].astype(np.int32)


def validation_mask(count: int, fraction: float) -> np.ndarray:
    """True for the examples held out: index i is when floor((i+1)f) > floor(i f).

    Exactly round-down(count * fraction) examples, spread evenly over the
    data (a file sorted by class still gives every class its share).
    """
    index = np.arange(count, dtype=np.float64)
    return np.floor((index + 1) * fraction) > np.floor(index * fraction)


def shard_size(count: int, rank: int, size: int) -> int:
    """Examples rank `rank` gets of `count` when each keeps every size-th one."""
    return len(range(rank, count, size))


def expand_paths(patterns: Sequence[str]) -> List[str]:
    """Globs expanded (sorted, de-duplicated, in pattern order)."""
    files: List[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
            [pattern] if os.path.exists(pattern) else [])
        for match in matches:
            if match not in files:
                files.append(match)
    return files


def compression_for(setting: Optional[str], files: Sequence[str]) -> str:
    """tf.data's compression_type: '', 'GZIP' or 'ZLIB' ('auto': by file suffix)."""
    if setting in (None, "auto"):
        first = files[0] if files else ""
        if first.endswith((".gz", ".gzip")):
            return "GZIP"
        if first.endswith((".zz", ".zlib")):
            return "ZLIB"
        return ""
    return {"none": "", "gzip": "GZIP", "zlib": "ZLIB"}[setting]


def read_first_line(path: str, compression: str) -> str:
    """The first line of a (possibly compressed) text file."""
    if compression == "GZIP":
        with gzip.open(path, "rt") as f:
            return f.readline()
    if compression == "ZLIB":
        with open(path, "rb") as f:
            data = zlib.decompressobj().decompress(f.read(1 << 20))
        return data.decode("utf-8", "replace").split("\n", 1)[0]
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.readline()


def csv_columns(data: dict, first_line: str) -> Tuple[int, List[int], int, List[str]]:
    """(number of columns, feature column indices, label index, names) for a CSV."""
    cells = [c.strip() for c in first_line.rstrip("\r\n").split(",")]
    count = len(cells)
    names = cells if data["header"] else [str(i) for i in range(count)]

    def index_of(column: Any, what: str) -> int:
        if isinstance(column, int):
            if column >= count:
                raise DataError(f"column {column} does not exist; the file has "
                                f"{count} columns (0..{count - 1})", what)
            return column
        if column not in names:
            raise DataError(f"no column named {column!r}; the header has: "
                            f"{', '.join(names)}", what)
        return names.index(column)

    label = index_of(data["label"], "label")
    if data["columns"]:
        features = [index_of(c, "columns") for c in data["columns"]]
    else:
        features = [i for i in range(count) if i != label]
    return count, features, label, names

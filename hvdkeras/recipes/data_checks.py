"""Cheap checks of a recipe's data files and output folders before any rank
starts: a file that cannot be read to its end, a truncated last row or record,
binary bytes in a CSV, a folder that cannot be created. Standard library only
(no TensorFlow), so `hvdkeras validate` and `hvdkeras train` run them at once.

Each check reads a file's head and tail, and the whole file only where that
is cheap: an uncompressed CSV is scanned for line counts up to FULL_SCAN_BYTES,
a compressed file is decompressed to its end up to that many compressed bytes,
and a TFRecord file's record headers are walked (a seek per record) up to
MAX_RECORD_WALK records. Larger files get the head and tail checks only.

What may import this module: the rest of `hvdkeras.recipes`.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from typing import Optional, Tuple

FULL_SCAN_BYTES = 256 << 20
EDGE_BYTES = 64 << 10  # how much of the head and of the tail a CSV check reads
MAX_RECORD_WALK = 10_000_000
_TFRECORD_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_TFRECORD_FOOTER = 4  # uint32 masked CRC of the data


def _binary_offset(chunk: bytes, start: int) -> Optional[int]:
    """Offset of the first byte that cannot be in a text CSV (NUL or bad UTF-8)."""
    zero = chunk.find(b"\0")
    if zero >= 0:
        return start + zero
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError as error:
        # A multi-byte character cut at the chunk's edge is not an error.
        if error.end >= len(chunk) - 3 or error.start <= 3:
            return None
        return start + error.start
    return None


def _read_all(path: str, compression: str) -> bytes:
    """The whole (decompressed) content; raises ValueError when the stream is cut short."""
    with open(path, "rb") as f:
        raw = f.read()
    if compression == "GZIP":
        try:
            return gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as error:
            raise ValueError(f"the gzip stream is damaged or cut short ({error})") from None
    if compression == "ZLIB":
        decompressor = zlib.decompressobj()
        try:
            data = decompressor.decompress(raw)
        except zlib.error as error:
            raise ValueError(f"the zlib stream is damaged ({error})") from None
        if not decompressor.eof:
            raise ValueError("the zlib stream is cut short")
        return data
    return raw


def check_csv(path: str, compression: str, header: bool,
              columns: int) -> Tuple[Optional[int], Optional[str]]:
    """(rows of data or None when not counted, the problem or None) for one CSV file.

    Args:
        path: The file.
        compression: '', 'GZIP' or 'ZLIB'.
        header: Whether the first line names the columns.
        columns: How many columns the first line has; every row must have as many.
    """
    size = os.path.getsize(path)
    if compression or size <= FULL_SCAN_BYTES:
        if compression and size > FULL_SCAN_BYTES:
            return None, None  # too large to decompress here; the head was checked
        try:
            data = _read_all(path, compression)
        except ValueError as error:
            return None, f"{path}: {error}"
        edges = [(data, 0)]
        tail = data
    else:
        with open(path, "rb") as f:
            head = f.read(EDGE_BYTES)
            f.seek(max(0, size - EDGE_BYTES))
            tail = f.read()
        edges = [(head, 0), (tail, size - len(tail))]
        data = None
    for chunk, start in edges:
        offset = _binary_offset(chunk, start)
        if offset is not None:
            return None, (f"{path} holds binary bytes (at byte {offset}), not CSV text; "
                          "is it the right file, or compressed (set data.compression)?")
    lines = tail.rstrip(b"\r\n").split(b"\n")
    last = lines[-1] if lines else b""
    if not last.strip():
        return (0 if data is not None else None), None
    found = len(last.split(b","))
    rows = None if data is None else data.rstrip(b"\r\n").count(b"\n") + 1
    if found != columns:
        where = f"line {rows}" if rows is not None else "the last line"
        return None, (f"{path}: {where} has {found} column(s), the first line has {columns}; "
                      "the file looks truncated or malformed")
    if rows is None:
        return None, None
    return rows - (1 if header else 0), None


def check_tfrecord(path: str, compression: str) -> Tuple[Optional[int], Optional[str]]:
    """(records or None when not counted, the problem or None) for one TFRecord file.

    Walks the record framing (length, CRC, data, CRC) to the end of the file;
    a file whose last record is cut short, or whose lengths do not add up,
    is reported. The CRCs themselves are not computed (TensorFlow does that
    when it reads).
    """
    size = os.path.getsize(path)
    if compression:
        if size > FULL_SCAN_BYTES:
            return None, None
        try:
            data = _read_all(path, compression)
        except ValueError as error:
            return None, f"{path}: {error}"
        return _walk_records(path, len(data), lambda at: data[at:at + 8])
    with open(path, "rb") as f:
        def length_at(at: int) -> bytes:
            f.seek(at)
            return f.read(8)

        return _walk_records(path, size, length_at)


def _walk_records(path: str, size: int, length_at) -> Tuple[Optional[int], Optional[str]]:
    at, count = 0, 0
    while at < size:
        if count >= MAX_RECORD_WALK:
            return None, None
        raw = length_at(at)
        if len(raw) < 8 or at + _TFRECORD_HEADER > size:
            return None, (f"{path}: record {count + 1} is cut short (its header needs "
                          f"{_TFRECORD_HEADER} bytes, {size - at} left); the file looks truncated")
        (length,) = struct.unpack("<Q", raw)
        end = at + _TFRECORD_HEADER + length + _TFRECORD_FOOTER
        if end > size:
            return None, (f"{path}: record {count + 1} says it holds {length} bytes, but only "
                          f"{max(0, size - at - _TFRECORD_HEADER)} are left; the file looks "
                          "truncated (or is not a TFRecord file)")
        at, count = end, count + 1
    return count, None


def writable_dir_problem(path: str) -> Optional[str]:
    """Why the folder `path` could not be created or written (None if it can).

    Creates nothing: looks at the nearest folder that exists on the way.
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return f"cannot create {path}: {probe} is a file, not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        if probe == os.path.abspath(path):
            return f"cannot write into {path} (no write permission)"
        return f"cannot create {path}: {probe} is not writable"
    return None

"""The element types and reductions agree across the layers (see Note [wire
vocabulary] in ops/core/types.def): the table itself, what the loaded
library reports, the type lists of the registered TensorFlow ops, and the
Python constants that must exist before the library loads.

No MPI job: the library is loaded, the engine is not started.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry  # the test reads the registered ops

from hvdkeras import collectives
from hvdkeras.engine import library, types

pytestmark = pytest.mark.usefixtures("op_library_built")

TYPES_DEF = Path(__file__).resolve().parent.parent / "ops" / "core" / "types.def"
ROW = re.compile(r"^HVDKERAS_DTYPE\((\w+), (\d+), \"(\w+)\", (\d+), (true|false), (true|false), (\w+)\)$")
OP_ROW = re.compile(r"^HVDKERAS_REDUCE_OP\((\w+), (\d+), \"(\w+)\"\)$")


def table():
    """(dtype rows, reduce-op rows) as written in types.def."""
    lines = TYPES_DEF.read_text().splitlines()
    dtypes = [ROW.match(line).groups() for line in lines if ROW.match(line)]
    ops = [OP_ROW.match(line).groups() for line in lines if OP_ROW.match(line)]
    return dtypes, ops


def test_the_library_reports_the_table():
    dtypes, ops = table()
    assert len(dtypes) == 13 and len(ops) == 5
    vocabulary = library.vocabulary()
    assert [(d.name, d.value, d.bytes, d.reducible) for d in vocabulary.dtypes] == [
        (name, int(value), int(size), reducible == "true")
        for _, value, name, size, reducible, _, _ in dtypes]
    assert vocabulary.reduce_ops == {name: int(value) for _, value, name in ops}


def test_python_reduction_constants_match_the_library():
    reported = library.vocabulary().reduce_ops
    assert types.REDUCE_OP_NAMES == {value: name for name, value in reported.items()}
    for name, value in reported.items():
        assert getattr(types, name) == value == getattr(collectives, name)


def test_names_and_sizes_are_tensorflows():
    for dtype in library.vocabulary().dtypes:
        assert tf.as_dtype(dtype.name).name == dtype.name
        assert tf.as_dtype(dtype.name).size == dtype.bytes


def _allowed(op: str):
    library.ops()  # the TensorFlow binding registers the ops (the engine alone does not)
    (attr,) = [a for a in op_def_registry.get(op).attr if a.name == "T"]
    return [tf.as_dtype(t).name for t in attr.allowed_values.list.type]


@pytest.mark.parametrize("op, reducing", [
    ("HvdkerasAllreduce", True), ("HvdkerasReducescatter", True), ("HvdkerasBroadcast", False),
    ("HvdkerasAllgather", False), ("HvdkerasAlltoall", False)])
def test_registered_ops_accept_the_tables_types(op, reducing):
    vocabulary = library.vocabulary()
    expected = vocabulary.reducible_names if reducing else vocabulary.movable_names
    assert _allowed(op) == list(expected)
    assert list(vocabulary.reducible_names) == ["uint8", "int8", "int32", "int64", "float16",
                                                "bfloat16", "float32", "float64"]


def test_request_kinds_are_the_engines_op_types():
    """The non-TensorFlow bindings send OpType numbers (ops/core/common.h)."""
    import re

    from hvdkeras.engine import requests, toolchain

    header = (toolchain.ops_source_dir() / "core" / "common.h").read_text()
    body = header.split("enum class OpType")[1].split("};")[0]
    numbers = {name: int(value) for name, value in re.findall(r"k(\w+) = (\d+)", body)}
    assert {kind: numbers[kind.capitalize()] for kind in requests.KIND_NAMES} == {
        kind: getattr(requests, kind.upper()) for kind in requests.KIND_NAMES}

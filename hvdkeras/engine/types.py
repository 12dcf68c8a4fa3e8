"""The element types and reductions hvdkeras speaks (see Note [wire
vocabulary] in ops/core/types.def, the table they come from).

The reduction constants (`Average`, `Sum`, ...) must exist before the op
library is loaded, so they are written here and `tests/test_vocabulary.py`
checks them against the library's table; the element types are read from
the loaded library itself.

What may import this module: anything under `hvdkeras` (it needs neither
TensorFlow nor MPI to import).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Tuple

# Reductions, numbered as in Horovod (2 was Adasum).
Average = 0
Sum = 1
Min = 3
Max = 4
Product = 5

REDUCE_OP_NAMES: Dict[int, str] = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max",
                                   Product: "Product"}

# Adasum keeps Horovod's number but never reaches the engine: it is computed
# from an allgather in Python (hvdkeras/collectives/adasum.py), so it is not
# in the wire vocabulary.
Adasum = 2
ALL_REDUCE_OP_NAMES: Dict[int, str] = {**REDUCE_OP_NAMES, Adasum: "Adasum"}


@dataclasses.dataclass(frozen=True)
class DType:
    """One element type of the engine's table.

    Attributes:
        name: As TensorFlow (`tf.DType.name`) and NumPy spell it.
        value: The engine's number for it.
        bytes: Size of one element.
        reducible: Whether allreduce and reducescatter accept it; the other
            collectives move any type in the table.
    """

    name: str
    value: int
    bytes: int
    reducible: bool


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The loaded library's element types and reductions."""

    dtypes: Tuple[DType, ...]
    reduce_ops: Dict[str, int]

    @functools.cached_property
    def reducible_names(self) -> Tuple[str, ...]:
        """Names of the types allreduce and reducescatter accept, in table order."""
        return tuple(d.name for d in self.dtypes if d.reducible)

    @functools.cached_property
    def movable_names(self) -> Tuple[str, ...]:
        """Names of every type the collectives move, in table order."""
        return tuple(d.name for d in self.dtypes)


def parse_vocabulary(text: str) -> Vocabulary:
    """The library's table text ("dtype NAME VALUE BYTES reducible|movable" and
    "reduce_op NAME VALUE" lines) as a `Vocabulary`."""
    dtypes, reduce_ops = [], {}
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["dtype"]:
            _, name, value, size, kind = fields
            dtypes.append(DType(name, int(value), int(size), kind == "reducible"))
        elif fields[:1] == ["reduce_op"]:
            reduce_ops[fields[1]] = int(fields[2])
    return Vocabulary(tuple(dtypes), reduce_ops)

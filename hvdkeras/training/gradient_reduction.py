"""Averaging a list of gradients across ranks: the step shared by
`DistributedOptimizer` and `DistributedGradientTape`.

The whole list is reduced in as few collectives as possible: one
`grouped_allreduce` per group (and, inside it, one fused buffer per dtype), so
every rank submits the same tensors in the same order. Splitting into groups,
choosing scale factors and validating settings are plain functions, tested
without MPI.

What may import this module: the rest of `hvdkeras.training`.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, List, Optional, Sequence, Tuple

import tensorflow as tf

from hvdkeras.collectives import xla_calls
from hvdkeras.collectives.kernels import in_xla
from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.collectives.sparse import reduce_slices
from hvdkeras.engine import buckets, process_sets, world
from hvdkeras.engine.process_sets import ProcessSet, SetView, global_process_set
from hvdkeras.engine.types import Adasum, Average, Max, Min, Product, Sum
from hvdkeras.collectives.compression import Compression, Compressor

_SUPPORTED_OPS = {Average: "Average", Sum: "Sum", Adasum: "Adasum"}


@dataclasses.dataclass(frozen=True)
class ReductionSettings:
    """How gradients are reduced across ranks.

    Attributes:
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        compression: A `hvdkeras.Compression` member used on the wire.
        sparse_as_dense: Densify `tf.IndexedSlices` before grouping, so they
            are fused with the dense gradients.
        gradient_predivide_factor: f: gradients are multiplied by 1/f before
            the sum and by f/size after it (Average only).
        num_groups: Split the gradient list into this many contiguous groups,
            one collective each (0 or 1: a single group).
        groups: Explicit groups, as tuples of variables; gradients of
            variables not listed form one final group.
        name: Prefix of the collective names (must be the same on all ranks).
        process_set: The ranks the gradients are reduced over.
        scale_local_gradients: Divide the gradients of local variables
            (`register_local_var`), which are not reduced, by the process
            set's size, as Horovod does.
    """

    op: int = Average
    compression: Compressor = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    num_groups: int = 0
    groups: Optional[Tuple[Tuple, ...]] = None
    name: str = "DistributedGradients"
    process_set: ProcessSet = global_process_set
    scale_local_gradients: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.process_set, ProcessSet):
            raise TypeError(f"process_set must be an hvdkeras.ProcessSet, got "
                            f"{type(self.process_set).__name__}.")
        validate_settings(self.op, self.compression, self.gradient_predivide_factor,
                          self.num_groups, self.groups)


def validate_settings(op: int, compression: Compressor, gradient_predivide_factor: float,
                      num_groups: int, groups) -> None:
    """Raises a ValueError/TypeError naming the bad argument and a fix."""
    if op not in _SUPPORTED_OPS:
        known = {Min: "Min", Max: "Max", Product: "Product"}
        label = known.get(op, repr(op))
        raise ValueError(
            f"Gradients can be reduced with op=hvdkeras.Average, Sum or Adasum, got {label}. "
            "Use Average for the usual data-parallel semantics."
        )
    if not isinstance(compression, Compressor):
        raise TypeError(
            f"compression must be a member of hvdkeras.Compression (none, fp16, bf16), "
            f"got {compression!r}."
        )
    if not gradient_predivide_factor > 0:
        raise ValueError(
            f"gradient_predivide_factor must be positive, got {gradient_predivide_factor!r}."
        )
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(
            "gradient_predivide_factor only applies to op=hvdkeras.Average "
            f"(got op={_SUPPORTED_OPS[op]}); leave it at 1.0 or use Average."
        )
    if not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an integer >= 0, got {num_groups!r}.")
    if groups is not None and num_groups:
        raise ValueError("Pass either num_groups or groups, not both.")
    if groups is not None:
        for group in groups:
            if not isinstance(group, (list, tuple)):
                raise TypeError(
                    "groups must be a list of lists of variables, e.g. "
                    "[model.layers[0].trainable_variables, model.layers[1].trainable_variables]."
                )


def scale_factors(op: int, gradient_predivide_factor: float, size: int) -> Tuple[int, float, float]:
    """(op on the wire, prescale, postscale) for a gradient reduction.

    With a predivide factor f the average is split into a multiplication by
    1/f before the sum and by f/size after it: the result is the same average,
    but the partial sums stay smaller (useful with fp16 on the wire).

    Example: `scale_factors(Average, 4.0, 8) == (Sum, 0.25, 0.5)`.
    """
    if gradient_predivide_factor == 1.0:
        return op, 1.0, 1.0
    return Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / size


def plan_groups(present: Sequence[int], num_groups: int = 0,
                explicit: Optional[Sequence[Sequence[int]]] = None) -> List[List[int]]:
    """Splits the positions of the present gradients into reduction groups.

    Args:
        present: Positions (in the gradient list) of gradients that are not
            None, in list order.
        num_groups: Without `explicit`: the number of contiguous, near-equal
            groups (0 or 1 gives one group; never more groups than gradients).
        explicit: Groups as lists of positions. Positions not present are
            dropped, a position listed twice counts in its first group, and
            the present positions no group lists form one last group.

    Returns:
        Non-empty lists of positions, each in list order.

    Example: `plan_groups([0, 1, 2, 3, 4], num_groups=2) == [[0, 1, 2], [3, 4]]`.
    """
    present = list(present)
    if not present:
        return []
    if explicit is not None:
        present_set = set(present)
        taken: set = set()
        planned = []
        for group in explicit:
            members = sorted(i for i in set(group) if i in present_set and i not in taken)
            taken.update(members)
            if members:
                planned.append(members)
        rest = [i for i in present if i not in taken]
        if rest:
            planned.append(rest)
        return planned
    count = min(max(num_groups, 1), len(present))
    base, extra = divmod(len(present), count)
    planned, start = [], 0
    for g in range(count):
        end = start + base + (1 if g < extra else 0)
        planned.append(present[start:end])
        start = end
    return planned


def positions_of(groups: Sequence[Sequence], variables: Sequence) -> List[List[int]]:
    """Maps groups of variables to positions in `variables` (by identity)."""
    index = {id(v): i for i, v in enumerate(variables)}
    positions = []
    for group in groups:
        missing = [getattr(v, "path", getattr(v, "name", repr(v))) for v in group
                   if id(v) not in index]
        if missing:
            raise ValueError(
                f"groups lists variables that are not being trained: {missing}. "
                "Build groups from model.trainable_variables."
            )
        positions.append([index[id(v)] for v in group])
    return positions


def _buckets_wanted(settings: ReductionSettings) -> bool:
    """Whether the default grouping is gradient buckets (Note [gradient
    buckets]): Average or Sum (Adasum combines a group as a whole), and the
    ranks span hosts or the step runs on GPUs, unless
    `HVDKERAS_BACKWARD_OVERLAP` says otherwise (`buckets.overlap_wanted`).
    Every rank of a job sees the same kind of device, which keeps the
    answer, and so the requests' names, the same on every rank."""
    if settings.op not in (Average, Sum):
        return False
    w = world.require()
    return buckets.overlap_wanted(w.local_size, w.size, on_gpus=xla_calls.steps_on_gpu())


def bucket_groups(gradients: Sequence, positions: Sequence[int]) -> List[List[int]]:
    """`positions` (of `gradients`, the present ones in list order) grouped
    into buckets in the order back-propagation produces them (Note [gradient
    buckets]). A gradient whose size is unknown while tracing fills a bucket
    on its own."""
    limit = buckets.bucket_limit()
    sizes, dtypes = [], []
    for gradient in gradients:
        count = gradient.shape.num_elements() if gradient.shape.is_fully_defined() else None
        sizes.append(limit if count is None else count * gradient.dtype.size)
        dtypes.append(gradient.dtype.name)
    planned = buckets.buckets(sizes, dtypes, limit, min(limit, buckets.FIRST_BUCKET_BYTES))
    return [sorted(positions[k] for k in bucket) for bucket in planned]


def _densify(gradient) -> tf.Tensor:
    if isinstance(gradient, tf.IndexedSlices):
        return tf.convert_to_tensor(gradient)
    return gradient


def _reduce_group(tensors: List[tf.Tensor], settings: ReductionSettings, name: str,
                  ps: SetView) -> List[tf.Tensor]:
    wire_op, prescale, postscale = scale_factors(
        settings.op, settings.gradient_predivide_factor, ps.size)
    packed = [settings.compression.compress(t) for t in tensors]
    reduced = grouped_allreduce([p[0] for p in packed], name=name, op=wire_op,
                                prescale_factor=prescale, postscale_factor=postscale,
                                process_set=settings.process_set)
    return [settings.compression.decompress(r, p[1]) for r, p in zip(reduced, packed)]


def reduce_indexed_slices(slices: List[tf.IndexedSlices], settings: ReductionSettings,
                          name: str, ps: SetView) -> List[tf.IndexedSlices]:
    """Reduces `tf.IndexedSlices` gradients (e.g. from `Embedding`) sparsely.

    Every rank's values and indices are gathered (one fused allgather per
    dtype for all sparse gradients together) and the values scaled, so the
    optimizer gets `tf.IndexedSlices` holding every rank's rows, exactly what
    one process would see on the global batch, repeated indices included.
    That matters beyond bandwidth: Keras 3's Adam, for example, squares each
    slice before summing repeats, so a densified reduction would differ.
    """
    wire_op, prescale, postscale = scale_factors(
        settings.op, settings.gradient_predivide_factor, ps.size)
    return reduce_slices(slices, wire_op, prescale, postscale, settings.compression.compress,
                         settings.compression.decompress, name, ps)


def _scale_local(gradient, size: int):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(gradient.values / size, gradient.indices, gradient.dense_shape)
    return gradient / size


def reduce_gradients(gradients: Sequence, settings: ReductionSettings,
                     variables: Optional[Sequence] = None,
                     local_ids: AbstractSet[int] = frozenset()) -> List:
    """Reduces every gradient across ranks; None stays None.

    Args:
        gradients: Gradients (tensors, `tf.IndexedSlices` or None), in the
            same order on every rank.
        settings: A `ReductionSettings`.
        variables: The variables the gradients belong to (needed when
            `settings.groups` lists variables, or with `local_ids`).
        local_ids: `id()`s of local variables, whose gradients are kept
            (scaled by 1/size with `settings.scale_local_gradients`).

    Returns:
        A list like `gradients` with the reduced values.
    """
    gradients = list(gradients)
    result: List = [None] * len(gradients)
    present = [i for i, g in enumerate(gradients) if g is not None]
    ps = process_sets.view(settings.process_set)
    if local_ids and variables is not None:
        local = [i for i in present if id(variables[i]) in local_ids]
        for i in local:
            result[i] = (_scale_local(gradients[i], ps.size) if settings.scale_local_gradients
                         else gradients[i])
        present = [i for i in present if i not in set(local)]
    if not present:
        return result
    # Under XLA (Note [xla collectives]) only the allreduce has a form: sparse
    # gradients are densified, as sparse_as_dense would.
    if not settings.sparse_as_dense and not in_xla():
        sparse = [i for i in present if isinstance(gradients[i], tf.IndexedSlices)]
        present = [i for i in present if not isinstance(gradients[i], tf.IndexedSlices)]
        if sparse:
            reduced = reduce_indexed_slices([gradients[i] for i in sparse], settings,
                                            f"{settings.name}_sparse", ps)
            for i, r in zip(sparse, reduced):
                result[i] = r
    explicit = None
    if settings.groups is not None:
        if variables is None:
            raise ValueError("groups= needs the variables the gradients belong to.")
        explicit = positions_of(settings.groups, list(variables))
    if explicit is None and not settings.num_groups and _buckets_wanted(settings):
        planned, prefix = bucket_groups([gradients[i] for i in present], present), "_bucket"
    else:
        planned, prefix = plan_groups(present, settings.num_groups, explicit), ""
    for number, positions in enumerate(planned):
        name = settings.name if len(planned) == 1 else f"{settings.name}{prefix}_{number}"
        reduced = _reduce_group([_densify(gradients[i]) for i in positions], settings, name, ps)
        for i, r in zip(positions, reduced):
            result[i] = r
    return result

"""Wire compression for reductions (`allreduce(compression=...)`, and the gradients'
reduction in `DistributedOptimizer` and `DistributedGradientTape`).

A compressor casts floating-point tensors to a narrower type before they are
reduced across ranks and casts the result back afterwards. Halving the bytes
on the wire costs precision in the reduced values, not in the variables or the
optimizer state, which stay in their own dtype.

The compressors name their wire dtype (`wire_dtype`, a dtype name); the
casts here are TensorFlow's, and the other backends cast with their own
tensors. Importing this module loads no framework: under torch and JAX the
compressors are only names.

What may import this module: the rest of `hvdkeras.collectives`,
`hvdkeras.training`, `hvdkeras.backends`, the recipes' training code and the
top-level package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple

if TYPE_CHECKING:  # annotations only; the casts import TensorFlow when they run
    import tensorflow as tf


class Compressor:
    """Base class: `compress` before the collective, `decompress` after it.

    Subclasses override both methods. `compress` returns the tensor to send and
    a context object that `decompress` needs to restore the original dtype.
    """

    name = "none"

    def compress(self, tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        """Returns (tensor to reduce, context for `decompress`)."""
        return tensor, None

    def decompress(self, tensor: tf.Tensor, context: Any) -> tf.Tensor:
        """Returns the reduced `tensor` in the dtype it had before `compress`."""
        return tensor

    def __repr__(self) -> str:
        return f"Compression.{self.name}"


class _CastCompressor(Compressor):
    """Casts floating tensors of other widths to `wire_dtype` and back."""

    wire_dtype: str = "float16"

    def compress(self, tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        import tensorflow as tf  # lazy: only TensorFlow tensors are cast here

        original = tensor.dtype
        if original.is_floating and original.name != self.wire_dtype:
            return tf.cast(tensor, self.wire_dtype), original
        return tensor, None

    def decompress(self, tensor: tf.Tensor, context: Any) -> tf.Tensor:
        if context is None:
            return tensor
        import tensorflow as tf  # lazy: as in `compress`

        return tf.cast(tensor, context)


class FP16Compressor(_CastCompressor):
    """Sends floating tensors as float16 (10-bit mantissa, range +-65504)."""

    name = "fp16"
    wire_dtype = "float16"


class BF16Compressor(_CastCompressor):
    """Sends floating tensors as bfloat16 (float32's range, 7-bit mantissa)."""

    name = "bf16"
    wire_dtype = "bfloat16"


class Compression:
    """The available compressors, named as in Horovod.

    Attributes:
        none: Sends tensors unchanged (the default).
        fp16: Casts floating tensors to float16 on the wire. Large gradient
            values can overflow float16's range; unscaled float32 gradients
            usually fit.
        bf16: Casts floating tensors to bfloat16 on the wire: no overflow
            risk, less precision than fp16.

    Example:

    ```python
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                   compression=hvd.Compression.fp16)
    ```
    """

    none: Compressor = Compressor()
    fp16: Compressor = FP16Compressor()
    bf16: Compressor = BF16Compressor()

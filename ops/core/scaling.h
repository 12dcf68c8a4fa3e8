// Element-wise copies with scaling, used around the reduction: the prescale
// on the way in, and the averaging divisor and postscale on the way out.
#pragma once

#include <cstdint>

#include "core/common.h"
#include "core/element_ops.h"

namespace hvdkeras {

// dst[i] = src[i] * factor. A factor of exactly 1 is a plain copy. src and
// dst may be the same buffer.
void ScaleCopy(DataType dtype, const void* src, void* dst, int64_t count, double factor);

// dst[i] = src[i] / divisor * factor: the output stage of an allreduce
// (divisor = world size for Average, else 1). With factor 1 integer types use
// integer division, which rounds toward zero. src and dst may alias.
void FinalizeCopy(DataType dtype, const void* src, void* dst, int64_t count, int divisor,
                  double factor);

// The neutral element of a reduction: 0 for Sum and Average, 1 for Product,
// the largest value for Min, the lowest for Max.
NeutralKind NeutralKindOf(ReduceOp op);

// Fills `count` elements with the neutral element of `op` (0 for Sum and
// Average, 1 for Product, the largest value for Min, the lowest for Max): the
// contribution of a rank that has joined.
void FillNeutral(DataType dtype, ReduceOp op, void* dst, int64_t count);

}  // namespace hvdkeras

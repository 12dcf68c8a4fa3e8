// Elementwise reductions of one buffer into another, for the engine's own
// shared-memory allreduce (MPI does its own). Pure: no MPI.
#pragma once

#include <cstdint>

#include "core/common.h"

namespace hvdkeras {

// dst[i] = a[i] (op) b[i] for i < count; dst may be a or b. Average
// combines as Sum (the division happens once, after the reduction). float16
// and bfloat16 are combined in float and rounded once per step, as MPI's user
// ops here do. Returns false for a dtype that cannot be reduced.
bool Reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, int64_t count);

// Whether Reduce handles `dtype`.
bool CanReduce(DataType dtype);

// dst[i] = dst[i] (op) src[i] for i < count (Reduce with a = dst).
bool ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, int64_t count);

}  // namespace hvdkeras

#include "core/scaling.h"

#include <cstring>

#include "core/element_ops.h"

namespace hvdkeras {

namespace {

template <typename T>
struct ScaleFn {
  static void Run(const void* src, void* dst, int64_t count, double factor) {
    const T* in = static_cast<const T*>(src);
    T* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = ScaleElement(in[i], factor);
  }
};

template <typename T>
struct FinalizeFn {
  static void Run(const void* src, void* dst, int64_t count, int divisor, double factor) {
    const T* in = static_cast<const T*>(src);
    T* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = FinalizeElement(in[i], divisor, factor);
  }
};

template <typename T>
struct FillFn {
  static void Run(NeutralKind kind, void* dst, int64_t count) {
    const T element = Neutral<T>::Of(kind);
    T* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = element;
  }
};

template <template <typename> class Fn, typename... Args>
void Dispatch(DataType dtype, Args... args) {
  switch (dtype) {
    case DataType::kUInt8: Fn<uint8_t>::Run(args...); break;
    case DataType::kBool: Fn<uint8_t>::Run(args...); break;
    case DataType::kInt8: Fn<int8_t>::Run(args...); break;
    case DataType::kInt32: Fn<int32_t>::Run(args...); break;
    case DataType::kInt64: Fn<int64_t>::Run(args...); break;
    case DataType::kFloat16: Fn<Half>::Run(args...); break;
    case DataType::kBFloat16: Fn<BFloat>::Run(args...); break;
    case DataType::kFloat32: Fn<float>::Run(args...); break;
    case DataType::kFloat64: Fn<double>::Run(args...); break;
    case DataType::kUInt16: Fn<uint16_t>::Run(args...); break;
    case DataType::kInt16: Fn<int16_t>::Run(args...); break;
    case DataType::kUInt32: Fn<uint32_t>::Run(args...); break;
    case DataType::kUInt64: Fn<uint64_t>::Run(args...); break;
  }
}

}  // namespace

NeutralKind NeutralKindOf(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return kNeutralLargest;
    case ReduceOp::kMax: return kNeutralLowest;
    case ReduceOp::kProduct: return kNeutralOne;
    default: return kNeutralZero;
  }
}

void FillNeutral(DataType dtype, ReduceOp op, void* dst, int64_t count) {
  const NeutralKind kind = NeutralKindOf(op);
  if (kind == kNeutralZero) {
    std::memset(dst, 0, count * DataTypeSize(dtype));
    return;
  }
  Dispatch<FillFn>(dtype, kind, dst, count);
}

void ScaleCopy(DataType dtype, const void* src, void* dst, int64_t count, double factor) {
  if (factor == 1.0) {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  Dispatch<ScaleFn>(dtype, src, dst, count, factor);
}

void FinalizeCopy(DataType dtype, const void* src, void* dst, int64_t count, int divisor,
                  double factor) {
  if (divisor == 1 && factor == 1.0) {
    if (src != dst) std::memcpy(dst, src, count * DataTypeSize(dtype));
    return;
  }
  Dispatch<FinalizeFn>(dtype, src, dst, count, divisor, factor);
}

}  // namespace hvdkeras

#include "core/scaling.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "core/half.h"

namespace hvdkeras {

namespace {

// Reads and writes one element of each storage type as a double.
template <typename T>
struct Element {
  static double Load(const T& v) { return static_cast<double>(v); }
  static T Store(double v) { return static_cast<T>(v); }
};

struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

template <>
struct Element<Half> {
  static double Load(const Half& v) { return HalfToFloat(v.bits); }
  static Half Store(double v) { return Half{DoubleToHalf(v)}; }
};

template <>
struct Element<BFloat> {
  static double Load(const BFloat& v) { return BFloat16ToFloat(v.bits); }
  static BFloat Store(double v) { return BFloat{DoubleToBFloat16(v)}; }
};

template <typename T>
void ScaleTyped(const void* src, void* dst, int64_t count, double factor) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  for (int64_t i = 0; i < count; ++i) out[i] = Element<T>::Store(Element<T>::Load(in[i]) * factor);
}

template <typename T>
void FinalizeTyped(const void* src, void* dst, int64_t count, int divisor, double factor) {
  const T* in = static_cast<const T*>(src);
  T* out = static_cast<T*>(dst);
  if constexpr (std::is_integral_v<T>) {
    if (factor == 1.0) {
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<T>(in[i] / divisor);
      return;
    }
  }
  if (factor == 1.0) {
    // Divide rather than multiply by a reciprocal: exact whenever the true
    // average is representable.
    for (int64_t i = 0; i < count; ++i) out[i] = Element<T>::Store(Element<T>::Load(in[i]) / divisor);
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    out[i] = Element<T>::Store(Element<T>::Load(in[i]) / divisor * factor);
  }
}

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

template <typename T>
struct ScaleFn {
  static void Run(const void* src, void* dst, int64_t count, double factor) {
    ScaleTyped<T>(src, dst, count, factor);
  }
};

template <typename T>
struct FinalizeFn {
  static void Run(const void* src, void* dst, int64_t count, int divisor, double factor) {
    FinalizeTyped<T>(src, dst, count, divisor, factor);
  }
};

template <typename T>
struct FillFn {
  static void Run(ReduceOp op, void* dst, int64_t count) {
    T element;
    if constexpr (std::is_integral_v<T>) {
      element = op == ReduceOp::kMin   ? std::numeric_limits<T>::max()
                : op == ReduceOp::kMax ? std::numeric_limits<T>::lowest()
                                       : T{1};
    } else {  // float, double and the 16-bit floats
      const double inf = std::numeric_limits<double>::infinity();
      element = Element<T>::Store(op == ReduceOp::kMin ? inf : op == ReduceOp::kMax ? -inf : 1.0);
    }
    T* out = static_cast<T*>(dst);
    for (int64_t i = 0; i < count; ++i) out[i] = element;
  }
};

}  // namespace

void FillNeutral(DataType dtype, ReduceOp op, void* dst, int64_t count) {
  if (op == ReduceOp::kSum || op == ReduceOp::kAverage) {
    std::memset(dst, 0, count * DataTypeSize(dtype));
    return;
  }
  Dispatch<FillFn>(dtype, op, dst, count);
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

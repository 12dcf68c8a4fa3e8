#include "core/reduce_kernels.h"

#include <algorithm>
#include <type_traits>

#include "core/half.h"

namespace hvdkeras {

namespace {

template <typename T, typename Combine>
void Combine2(void* dst, const void* a, const void* b, int64_t count, Combine combine) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t i = 0; i < count; ++i) d[i] = combine(x[i], y[i]);
}

// Integers add and multiply modulo 2^bits (as MPI does), never with signed
// overflow.
template <typename T>
using Arith = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>,
                                          std::common_type<T>>::type;

template <typename T>
void ReduceTyped(ReduceOp op, void* dst, const void* lhs, const void* rhs, int64_t count) {
  using A = Arith<T>;
  switch (op) {
    case ReduceOp::kMin:
      Combine2<T>(dst, lhs, rhs, count, [](T a, T b) { return std::min(a, b); });
      return;
    case ReduceOp::kMax:
      Combine2<T>(dst, lhs, rhs, count, [](T a, T b) { return std::max(a, b); });
      return;
    case ReduceOp::kProduct:
      Combine2<T>(dst, lhs, rhs, count,
                  [](T a, T b) { return static_cast<T>(static_cast<A>(a) * static_cast<A>(b)); });
      return;
    default:  // Sum and Average
      Combine2<T>(dst, lhs, rhs, count,
                  [](T a, T b) { return static_cast<T>(static_cast<A>(a) + static_cast<A>(b)); });
      return;
  }
}

template <float (*kLoad)(uint16_t), uint16_t (*kStore)(float)>
void Reduce16(ReduceOp op, void* dst, const void* lhs, const void* rhs, int64_t count) {
  auto via_float = [](auto combine) {
    return [combine](uint16_t a, uint16_t b) { return kStore(combine(kLoad(a), kLoad(b))); };
  };
  switch (op) {
    case ReduceOp::kMin:
      Combine2<uint16_t>(dst, lhs, rhs, count,
                         via_float([](float a, float b) { return std::min(a, b); }));
      return;
    case ReduceOp::kMax:
      Combine2<uint16_t>(dst, lhs, rhs, count,
                         via_float([](float a, float b) { return std::max(a, b); }));
      return;
    case ReduceOp::kProduct:
      Combine2<uint16_t>(dst, lhs, rhs, count, via_float([](float a, float b) { return a * b; }));
      return;
    default:
      Combine2<uint16_t>(dst, lhs, rhs, count, via_float([](float a, float b) { return a + b; }));
      return;
  }
}

}  // namespace

bool Reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b,
            int64_t count) {
  switch (dtype) {
    case DataType::kUInt8: ReduceTyped<uint8_t>(op, dst, a, b, count); return true;
    case DataType::kInt8: ReduceTyped<int8_t>(op, dst, a, b, count); return true;
    case DataType::kInt32: ReduceTyped<int32_t>(op, dst, a, b, count); return true;
    case DataType::kInt64: ReduceTyped<int64_t>(op, dst, a, b, count); return true;
    case DataType::kFloat32: ReduceTyped<float>(op, dst, a, b, count); return true;
    case DataType::kFloat64: ReduceTyped<double>(op, dst, a, b, count); return true;
    case DataType::kFloat16:
      Reduce16<HalfToFloat, FloatToHalf>(op, dst, a, b, count);
      return true;
    case DataType::kBFloat16:
      Reduce16<BFloat16ToFloat, FloatToBFloat16>(op, dst, a, b, count);
      return true;
    default: return false;
  }
}

bool CanReduce(DataType dtype) {
  return Reduce(dtype, ReduceOp::kSum, nullptr, nullptr, nullptr, 0);
}

bool ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, int64_t count) {
  return Reduce(dtype, op, dst, dst, src, count);
}

}  // namespace hvdkeras

// Unit tests of the shared-memory allreduce's reduction kernels
// (core/reduce_kernels.cc).
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/reduce_kernels.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::ReduceOp;

// ---- Reduction kernels (shared-memory allreduce) ---------------------------

TEST(ReduceIntoEveryOpOnFloats) {
  const std::vector<float> a{1, -2, 3.5f, 0};
  const std::vector<float> b{4, 5, -1, 0};
  std::vector<float> d = a;
  CHECK(hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kSum, d.data(), b.data(), 4));
  CHECK_EQ(d, (std::vector<float>{5, 3, 2.5f, 0}));
  d = a;
  CHECK(hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kAverage, d.data(), b.data(), 4));
  CHECK_EQ(d, (std::vector<float>{5, 3, 2.5f, 0}));  // averaging divides later
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kMin, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{1, -2, -1, 0}));
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kMax, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{4, 5, 3.5f, 0}));
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kProduct, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{4, -10, -3.5f, 0}));
  std::vector<double> x{1.5, 2}, y{0.25, -4};
  hvdkeras::ReduceInto(DataType::kFloat64, ReduceOp::kSum, x.data(), y.data(), 2);
  CHECK_EQ(x, (std::vector<double>{1.75, -2}));
}

TEST(ReduceIntoSeparateDestinationAndLongBuffers) {
  // dst = a (op) b with dst distinct from both, over a length that leaves a
  // tail after any vector width; a and b are left as they were.
  const int n = 1027;
  std::vector<float> a(n), b(n), d(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = static_cast<float>(n - i);
  }
  const std::vector<float> a0 = a, b0 = b;
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kSum, d.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(d[i], a[i] + b[i]);
  CHECK_EQ(a, a0);
  CHECK_EQ(b, b0);
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kMax, d.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(d[i], std::max(a[i], b[i]));
  // The destination may be the second operand too.
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kProduct, b.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(b[i], a0[i] * b0[i]);
  std::vector<int32_t> x{7, -3, 2}, y{1, 1, 1}, z(3);
  CHECK(hvdkeras::Reduce(DataType::kInt32, ReduceOp::kMin, z.data(), x.data(), y.data(), 3));
  CHECK_EQ(z, (std::vector<int32_t>{1, -3, 1}));
  CHECK(!hvdkeras::Reduce(DataType::kBool, ReduceOp::kSum, z.data(), x.data(), y.data(), 1));
}

TEST(ReduceIntoIntegersWrapLikeMpi) {
  std::vector<int8_t> a{100, -100, 7}, b{100, -100, -9};
  hvdkeras::ReduceInto(DataType::kInt8, ReduceOp::kSum, a.data(), b.data(), 3);
  CHECK_EQ(a, (std::vector<int8_t>{-56, 56, -2}));
  std::vector<uint8_t> u{250, 3}, v{10, 4};
  hvdkeras::ReduceInto(DataType::kUInt8, ReduceOp::kSum, u.data(), v.data(), 2);
  CHECK_EQ(u, (std::vector<uint8_t>{4, 7}));
  std::vector<int32_t> i{std::numeric_limits<int32_t>::max(), -5}, j{1, 3};
  hvdkeras::ReduceInto(DataType::kInt32, ReduceOp::kSum, i.data(), j.data(), 2);
  CHECK_EQ(i, (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -2}));
  std::vector<int64_t> k{-3, 6}, l{4, -2};
  hvdkeras::ReduceInto(DataType::kInt64, ReduceOp::kProduct, k.data(), l.data(), 2);
  CHECK_EQ(k, (std::vector<int64_t>{-12, -12}));
  hvdkeras::ReduceInto(DataType::kInt64, ReduceOp::kMin, k.data(), l.data(), 2);
  CHECK_EQ(k, (std::vector<int64_t>{-12, -12}));
}

TEST(ReduceIntoHalfAndBFloat16) {
  using hvdkeras::FloatToHalf;
  using hvdkeras::HalfToFloat;
  std::vector<uint16_t> a{FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  const std::vector<uint16_t> b{FloatToHalf(0.25f), FloatToHalf(8.0f)};
  hvdkeras::ReduceInto(DataType::kFloat16, ReduceOp::kSum, a.data(), b.data(), 2);
  CHECK_EQ(HalfToFloat(a[0]), 1.75f);
  CHECK_EQ(HalfToFloat(a[1]), 6.0f);
  hvdkeras::ReduceInto(DataType::kFloat16, ReduceOp::kMax, a.data(), b.data(), 2);
  CHECK_EQ(HalfToFloat(a[0]), 1.75f);
  CHECK_EQ(HalfToFloat(a[1]), 8.0f);
  std::vector<uint16_t> c{hvdkeras::FloatToBFloat16(3.0f)};
  const std::vector<uint16_t> e{hvdkeras::FloatToBFloat16(-0.5f)};
  hvdkeras::ReduceInto(DataType::kBFloat16, ReduceOp::kProduct, c.data(), e.data(), 1);
  CHECK_EQ(hvdkeras::BFloat16ToFloat(c[0]), -1.5f);
  bool reduced = hvdkeras::ReduceInto(DataType::kBool, ReduceOp::kSum, c.data(), e.data(), 1);
  CHECK(!reduced);
}

}  // namespace

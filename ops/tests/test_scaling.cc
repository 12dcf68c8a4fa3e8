// Unit tests of the scaling copies around a reduction and of the neutral
// elements a joined rank contributes (core/scaling.cc).
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/scaling.h"
#include "tests/float_bits.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::ReduceOp;
using test_harness::IsHalfNan;

// ==========================================================================
// ScaleCopy / FinalizeCopy
// ==========================================================================

std::vector<uint16_t> Halves(std::initializer_list<float> values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(hvdkeras::FloatToHalf(v));
  return out;
}

TEST(ScaleCopyFloat) {
  const std::vector<float> in = {1.0f, -2.5f, 0.0f, 3.0f};
  std::vector<float> out(4, 99.0f);
  hvdkeras::ScaleCopy(DataType::kFloat32, in.data(), out.data(), 4, 2.0);
  CHECK_EQ(out, (std::vector<float>{2.0f, -5.0f, 0.0f, 6.0f}));
  // In place.
  std::vector<float> buf = in;
  hvdkeras::ScaleCopy(DataType::kFloat32, buf.data(), buf.data(), 4, 0.5);
  CHECK_EQ(buf, (std::vector<float>{0.5f, -1.25f, 0.0f, 1.5f}));
  // Factor 1 is a bit-exact copy (NaN payloads included).
  const std::vector<uint32_t> raw = {0x7fc01234u, 0x3f800000u, 0x80000000u};
  std::vector<uint32_t> copy(3, 0);
  hvdkeras::ScaleCopy(DataType::kFloat32, raw.data(), copy.data(), 3, 1.0);
  CHECK_EQ(copy, raw);
  // float64 keeps double precision.
  const std::vector<double> d = {1.0 / 3.0, 1e300};
  std::vector<double> dout(2);
  hvdkeras::ScaleCopy(DataType::kFloat64, d.data(), dout.data(), 2, 3.0);
  CHECK_EQ(dout, (std::vector<double>{1.0 / 3.0 * 3.0, 3e300}));
  // Count 0 touches nothing.
  hvdkeras::ScaleCopy(DataType::kFloat32, in.data(), out.data(), 0, 5.0);
  CHECK_EQ(out[0], 2.0f);
}

TEST(ScaleCopyIntegers) {
  // Scaled integers truncate toward zero.
  const std::vector<int32_t> in = {5, -5, 7, 100};
  std::vector<int32_t> out(4);
  hvdkeras::ScaleCopy(DataType::kInt32, in.data(), out.data(), 4, 0.5);
  CHECK_EQ(out, (std::vector<int32_t>{2, -2, 3, 50}));
  const std::vector<int64_t> big = {int64_t{1} << 40};
  std::vector<int64_t> big_out(1);
  hvdkeras::ScaleCopy(DataType::kInt64, big.data(), big_out.data(), 1, 4.0);
  CHECK_EQ(big_out[0], int64_t{1} << 42);
  const std::vector<uint8_t> bytes = {10, 255};
  std::vector<uint8_t> bytes_out(2);
  hvdkeras::ScaleCopy(DataType::kUInt8, bytes.data(), bytes_out.data(), 2, 0.5);
  CHECK_EQ(bytes_out, (std::vector<uint8_t>{5, 127}));
}

TEST(ScaleCopyHalfPrescale) {
  const std::vector<uint16_t> in = Halves({1.0f, 2.0f, -0.5f, 65504.0f, 3.0f});
  std::vector<uint16_t> out(in.size());
  hvdkeras::ScaleCopy(DataType::kFloat16, in.data(), out.data(), in.size(), 0.5);
  CHECK_EQ(out, Halves({0.5f, 1.0f, -0.25f, 32752.0f, 1.5f}));
  hvdkeras::ScaleCopy(DataType::kFloat16, in.data(), out.data(), in.size(), 2.0);
  CHECK_EQ(out, (std::vector<uint16_t>{0x4000, 0x4400, 0xbc00, 0x7c00, 0x4600}));  // 65504*2 = inf
  // Rounding of the scaled value is to nearest even, into the subnormals too.
  const std::vector<uint16_t> sub = {0x0001, 0x0003, 0x0005, 0x3c01};
  std::vector<uint16_t> sub_out(sub.size());
  hvdkeras::ScaleCopy(DataType::kFloat16, sub.data(), sub_out.data(), sub.size(), 0.5);
  // 0.5 -> 0 (tie, even), 1.5 -> 2, 2.5 -> 2, (1 + 2^-10) / 2 exact.
  CHECK_EQ(sub_out, (std::vector<uint16_t>{0x0000, 0x0002, 0x0002, 0x3801}));
  // In place, with a factor that is not a power of two.
  std::vector<uint16_t> buf = Halves({3.0f, -6.0f});
  hvdkeras::ScaleCopy(DataType::kFloat16, buf.data(), buf.data(), 2, 1.0 / 3.0);
  CHECK_EQ(buf, Halves({1.0f, -2.0f}));
  // NaN and infinity pass through a scale.
  const std::vector<uint16_t> special = {0x7c00, 0xfc00, 0x7e00};
  std::vector<uint16_t> special_out(3);
  hvdkeras::ScaleCopy(DataType::kFloat16, special.data(), special_out.data(), 3, 0.5);
  CHECK_EQ(special_out[0], uint16_t{0x7c00});
  CHECK_EQ(special_out[1], uint16_t{0xfc00});
  CHECK(IsHalfNan(special_out[2]));
}

TEST(ScaleCopyHalfRoundsOnce) {
  // 1 * (1 + 2^-11 + 2^-30) lies just above the midpoint between 1 and the
  // next half (1 + 2^-10): the correct result rounds up. Rounding to float
  // first would land exactly on the midpoint and then round down to even.
  const std::vector<uint16_t> one = {0x3c00};
  std::vector<uint16_t> out(1);
  hvdkeras::ScaleCopy(DataType::kFloat16, one.data(), out.data(), 1,
                      1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30));
  CHECK_EQ(out[0], uint16_t{0x3c01});
  const std::vector<uint16_t> bf_one = {0x3f80};
  hvdkeras::ScaleCopy(DataType::kBFloat16, bf_one.data(), out.data(), 1,
                      1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  CHECK_EQ(out[0], uint16_t{0x3f81});
}

TEST(ScaleCopyBFloat16) {
  const std::vector<uint16_t> in = {0x3f80, 0xc000};  // 1, -2
  std::vector<uint16_t> out(2);
  hvdkeras::ScaleCopy(DataType::kBFloat16, in.data(), out.data(), 2, 3.0);
  CHECK_EQ(out, (std::vector<uint16_t>{0x4040, 0xc0c0}));  // 3, -6
}

TEST(FinalizeCopyIntegerAverageRoundsTowardZero) {
  const std::vector<int32_t> in = {7, -7, 4, -1, 1, 0};
  std::vector<int32_t> out(in.size());
  hvdkeras::FinalizeCopy(DataType::kInt32, in.data(), out.data(), in.size(), 2, 1.0);
  CHECK_EQ(out, (std::vector<int32_t>{3, -3, 2, 0, 0, 0}));
  hvdkeras::FinalizeCopy(DataType::kInt32, in.data(), out.data(), in.size(), 3, 1.0);
  CHECK_EQ(out, (std::vector<int32_t>{2, -2, 1, 0, 0, 0}));
  // int64 averages stay exact beyond 2^53 (no trip through double).
  const std::vector<int64_t> big = {(int64_t{1} << 60) + 3, -((int64_t{1} << 60) + 3)};
  std::vector<int64_t> big_out(2);
  hvdkeras::FinalizeCopy(DataType::kInt64, big.data(), big_out.data(), 2, 3, 1.0);
  CHECK_EQ(big_out, (std::vector<int64_t>{((int64_t{1} << 60) + 3) / 3,
                                          -(((int64_t{1} << 60) + 3) / 3)}));
  const std::vector<int8_t> small = {-128, 127, -1};
  std::vector<int8_t> small_out(3);
  hvdkeras::FinalizeCopy(DataType::kInt8, small.data(), small_out.data(), 3, 3, 1.0);
  CHECK_EQ(small_out, (std::vector<int8_t>{-42, 42, 0}));
  const std::vector<uint8_t> bytes = {255, 3};
  std::vector<uint8_t> bytes_out(2);
  hvdkeras::FinalizeCopy(DataType::kUInt8, bytes.data(), bytes_out.data(), 2, 2, 1.0);
  CHECK_EQ(bytes_out, (std::vector<uint8_t>{127, 1}));
  // In place.
  std::vector<int32_t> buf = {9, -9};
  hvdkeras::FinalizeCopy(DataType::kInt32, buf.data(), buf.data(), 2, 4, 1.0);
  CHECK_EQ(buf, (std::vector<int32_t>{2, -2}));
  // With a postscale the quotient is not truncated before scaling.
  buf = {7};
  hvdkeras::FinalizeCopy(DataType::kInt32, buf.data(), buf.data(), 1, 2, 2.0);
  CHECK_EQ(buf[0], 7);
}

TEST(FinalizeCopyFloat) {
  const std::vector<float> in = {3.0f, 1.0f, -6.0f};
  std::vector<float> out(3);
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 3, 1.0);
  CHECK_EQ(out, (std::vector<float>{1.0f, static_cast<float>(1.0 / 3.0), -2.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 1, 2.0);  // postscale only
  CHECK_EQ(out, (std::vector<float>{6.0f, 2.0f, -12.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 2, 4.0);
  CHECK_EQ(out, (std::vector<float>{6.0f, 2.0f, -12.0f}));
  // divisor 1, factor 1: plain copy, in place is a no-op.
  std::vector<float> buf = in;
  hvdkeras::FinalizeCopy(DataType::kFloat32, buf.data(), buf.data(), 3, 1, 1.0);
  CHECK_EQ(buf, in);
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 1, 1.0);
  CHECK_EQ(out, in);
  // float64 average: 0.1 + 0.2 + 0.3 summed then divided.
  const std::vector<double> d = {0.6, 1e-300};
  std::vector<double> dout(2);
  hvdkeras::FinalizeCopy(DataType::kFloat64, d.data(), dout.data(), 2, 3, 1.0);
  CHECK_EQ(dout, (std::vector<double>{0.6 / 3, 1e-300 / 3}));
}

TEST(FinalizeCopyHalfAndBFloat16) {
  // Average of a float16 sum: 3.0 / 2 = 1.5; 1.0 / 3 rounds to nearest half.
  const std::vector<uint16_t> in = Halves({3.0f, 1.0f, -65504.0f});
  std::vector<uint16_t> out(3);
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 2, 1.0);
  CHECK_EQ(out, Halves({1.5f, 0.5f, -32752.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 3, 1.0);
  CHECK_EQ(out[0], uint16_t{0x3c00});
  CHECK_EQ(out[1], uint16_t{0x3555});  // 1/3 in half
  // Postscale on top of the average.
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 2, 0.5);
  CHECK_EQ(out, Halves({0.75f, 0.25f, -16376.0f}));
  // bfloat16: 3 / 2 = 1.5.
  const std::vector<uint16_t> b = {0x4040};
  std::vector<uint16_t> bout(1);
  hvdkeras::FinalizeCopy(DataType::kBFloat16, b.data(), bout.data(), 1, 2, 1.0);
  CHECK_EQ(bout[0], uint16_t{0x3fc0});
}

TEST(FillNeutralElements) {
  // Sum and Average: zero; Product: one; Min: the largest value; Max: the lowest.
  std::vector<float> f(3, 9.0f);
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kSum, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{0, 0, 0}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kAverage, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{0, 0, 0}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kProduct, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{1, 1, 1}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kMin, f.data(), 3);
  CHECK_EQ(f[0], std::numeric_limits<float>::infinity());
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kMax, f.data(), 3);
  CHECK_EQ(f[2], -std::numeric_limits<float>::infinity());

  std::vector<double> d(2, 5.0);
  hvdkeras::FillNeutral(DataType::kFloat64, ReduceOp::kMin, d.data(), 2);
  CHECK_EQ(d[1], std::numeric_limits<double>::infinity());

  std::vector<int64_t> i64(2, 5);
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kMin, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>(2, std::numeric_limits<int64_t>::max())));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kMax, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>(2, std::numeric_limits<int64_t>::min())));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kProduct, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>{1, 1}));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kSum, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>{0, 0}));

  std::vector<int32_t> i32(1);
  hvdkeras::FillNeutral(DataType::kInt32, ReduceOp::kMin, i32.data(), 1);
  CHECK_EQ(i32[0], std::numeric_limits<int32_t>::max());
  hvdkeras::FillNeutral(DataType::kInt32, ReduceOp::kMax, i32.data(), 1);
  CHECK_EQ(i32[0], std::numeric_limits<int32_t>::min());
  std::vector<int8_t> i8(1);
  hvdkeras::FillNeutral(DataType::kInt8, ReduceOp::kMax, i8.data(), 1);
  CHECK_EQ(i8[0], int8_t{-128});
  std::vector<uint8_t> u8(1);
  hvdkeras::FillNeutral(DataType::kUInt8, ReduceOp::kMin, u8.data(), 1);
  CHECK_EQ(u8[0], uint8_t{255});
  hvdkeras::FillNeutral(DataType::kUInt8, ReduceOp::kMax, u8.data(), 1);
  CHECK_EQ(u8[0], uint8_t{0});

  std::vector<uint16_t> h(2);
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kMin, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x7c00, 0x7c00}));
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kMax, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0xfc00, 0xfc00}));
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kProduct, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x3c00, 0x3c00}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kMin, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x7f80, 0x7f80}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kProduct, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x3f80, 0x3f80}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kSum, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0, 0}));
}

}  // namespace

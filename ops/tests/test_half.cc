// Unit tests of the float16 and bfloat16 conversions (core/half.h) against
// a reference rounding, including every float16 value.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "tests/float_bits.h"
#include "tests/harness.h"

namespace {

using test_harness::Fail;
using test_harness::Show;
using test_harness::g_checks;
using test_harness::g_failures;
using test_harness::BitsOf;
using test_harness::FloatFromBits;
using test_harness::IsBFloatNan;
using test_harness::IsHalfNan;

// ==========================================================================
// float16 / bfloat16 conversions
// ==========================================================================

// Correctly rounded (to nearest, ties to even) value of |f| in a binary
// format with `mantissa_bits` stored mantissa bits and smallest normal
// exponent `min_exp`, computed in double (exact for float inputs).
double ReferenceRound(float f, int mantissa_bits, int min_exp) {
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return 0;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;
  if (exponent < min_exp) exponent = min_exp;  // subnormal range: fixed ulp
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  const double q = a / ulp;  // exact: a power-of-two scaling
  double n = std::floor(q);
  const double r = q - n;
  if (r > 0.5 || (r == 0.5 && std::fmod(n, 2.0) == 1.0)) n += 1;
  return n * ulp;
}

void CheckHalfAgainstReference(float f) {
  const uint16_t h = hvdkeras::FloatToHalf(f);
  if (std::isnan(f)) {
    if (!IsHalfNan(h)) Fail(__FILE__, __LINE__, "FloatToHalf(nan) is not a NaN: " + Show(h));
    return;
  }
  double expected = ReferenceRound(f, 10, -14);
  if (expected >= 65536.0) expected = std::numeric_limits<double>::infinity();
  const double got = std::fabs(static_cast<double>(hvdkeras::HalfToFloat(h)));
  const bool sign_ok = ((h & 0x8000u) != 0) == std::signbit(f);
  if (got != expected || !sign_ok) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "FloatToHalf(%.9g [0x%08x]) = 0x%04x (%.9g), expected magnitude %.9g", f,
                  BitsOf(f), h, hvdkeras::HalfToFloat(h), expected);
    Fail(__FILE__, __LINE__, buf);
  }
}

void CheckBFloatAgainstReference(float f) {
  const uint16_t b = hvdkeras::FloatToBFloat16(f);
  if (std::isnan(f)) {
    if (!IsBFloatNan(b)) Fail(__FILE__, __LINE__, "FloatToBFloat16(nan) is not a NaN: " + Show(b));
    return;
  }
  double expected = ReferenceRound(f, 7, -126);
  if (expected >= std::ldexp(1.0, 128)) expected = std::numeric_limits<double>::infinity();
  const double got = std::fabs(static_cast<double>(hvdkeras::BFloat16ToFloat(b)));
  const bool sign_ok = ((b & 0x8000u) != 0) == std::signbit(f);
  if (got != expected || !sign_ok) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "FloatToBFloat16(%.9g [0x%08x]) = 0x%04x (%.9g), expected magnitude %.9g", f,
                  BitsOf(f), b, hvdkeras::BFloat16ToFloat(b), expected);
    Fail(__FILE__, __LINE__, buf);
  }
}

TEST(HalfKnownValues) {
  using hvdkeras::FloatToHalf;
  using hvdkeras::HalfToFloat;
  CHECK_EQ(HalfToFloat(0x0000), 0.0f);
  CHECK(std::signbit(HalfToFloat(0x8000)));
  CHECK_EQ(HalfToFloat(0x3c00), 1.0f);
  CHECK_EQ(HalfToFloat(0xc000), -2.0f);
  CHECK_EQ(HalfToFloat(0x3555), 0.333251953125f);
  CHECK_EQ(HalfToFloat(0x7bff), 65504.0f);                    // largest finite
  CHECK_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));       // smallest normal
  CHECK_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));       // smallest subnormal
  CHECK_EQ(HalfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  CHECK_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  CHECK_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  CHECK_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(HalfToFloat(0x7e00)));
  CHECK(std::isnan(HalfToFloat(0x7c01)));
  CHECK(std::isnan(HalfToFloat(0xfe00)));

  CHECK_EQ(FloatToHalf(0.0f), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(-0.0f), uint16_t{0x8000});
  CHECK_EQ(FloatToHalf(1.0f), uint16_t{0x3c00});
  CHECK_EQ(FloatToHalf(-2.0f), uint16_t{0xc000});
  CHECK_EQ(FloatToHalf(65504.0f), uint16_t{0x7bff});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), uint16_t{0xfc00});
  CHECK(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsHalfNan(FloatToHalf(-std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsHalfNan(FloatToHalf(FloatFromBits(0x7f800001u))));  // signalling NaN, tiny payload
}

TEST(HalfRoundToNearestEven) {
  using hvdkeras::FloatToHalf;
  const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0
  CHECK_EQ(FloatToHalf(1.0f + ulp1 / 2), uint16_t{0x3c00});          // tie -> even (down)
  CHECK_EQ(FloatToHalf(1.0f + 3 * ulp1 / 2), uint16_t{0x3c02});      // tie -> even (up)
  CHECK_EQ(FloatToHalf(std::nextafter(1.0f + ulp1 / 2, 2.0f)), uint16_t{0x3c01});  // above tie
  CHECK_EQ(FloatToHalf(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)), uint16_t{0x3c01});
  CHECK_EQ(FloatToHalf(-(1.0f + ulp1 / 2)), uint16_t{0xbc00});
  CHECK_EQ(FloatToHalf(2047.5f), uint16_t{0x6800});  // 2047.5 -> 2048 (tie, 2047 odd)
  CHECK_EQ(FloatToHalf(2049.0f), uint16_t{0x6800});  // tie between 2048 and 2050 -> 2048
  CHECK_EQ(FloatToHalf(2051.0f), uint16_t{0x6802});  // tie between 2050 and 2052 -> 2052
  // Overflow boundary: 65519.99 -> 65504; 65520 is a tie with an odd
  // mantissa, so it rounds up, to infinity.
  CHECK_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), uint16_t{0x7bff});
  CHECK_EQ(FloatToHalf(65520.0f), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(-65520.0f), uint16_t{0xfc00});
  CHECK_EQ(FloatToHalf(1e6f), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::max()), uint16_t{0x7c00});
}

TEST(HalfSubnormals) {
  using hvdkeras::FloatToHalf;
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  CHECK_EQ(FloatToHalf(tiny), uint16_t{0x0001});
  CHECK_EQ(FloatToHalf(tiny / 2), uint16_t{0x0000});             // tie -> even (zero)
  CHECK_EQ(FloatToHalf(-tiny / 2), uint16_t{0x8000});
  CHECK_EQ(FloatToHalf(std::nextafter(tiny / 2, 1.0f)), uint16_t{0x0001});
  CHECK_EQ(FloatToHalf(std::nextafter(tiny / 2, 0.0f)), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(1.5f * tiny), uint16_t{0x0002});           // tie 1|2 -> 2
  CHECK_EQ(FloatToHalf(2.5f * tiny), uint16_t{0x0002});           // tie 2|3 -> 2
  CHECK_EQ(FloatToHalf(1023.5f * tiny), uint16_t{0x0400});        // rounds into the normals
  CHECK_EQ(FloatToHalf(1022.5f * tiny), uint16_t{0x03fe});
  CHECK_EQ(FloatToHalf(std::ldexp(1.0f, -14)), uint16_t{0x0400});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(-std::numeric_limits<float>::min()), uint16_t{0x8000});
  for (uint16_t m = 1; m < 0x400; ++m) {  // every subnormal, both signs
    CHECK_EQ(hvdkeras::HalfToFloat(m), m * tiny);
    CHECK_EQ(hvdkeras::HalfToFloat(static_cast<uint16_t>(m | 0x8000u)), -(m * tiny));
  }
}

TEST(HalfRoundTripEveryValue) {
  int failures = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = hvdkeras::HalfToFloat(bits);
    const uint16_t back = hvdkeras::FloatToHalf(f);
    const bool ok = IsHalfNan(bits) ? (std::isnan(f) && IsHalfNan(back)) : back == bits;
    if (!ok && ++failures <= 5) {
      Fail(__FILE__, __LINE__, "half round trip of " + Show(bits) + " gave " + Show(back));
    }
    ++g_checks;
  }
}

TEST(HalfMatchesReferenceRounding) {
  // Every tie point between neighbouring finite halves and the floats just
  // either side of it...
  const int before = g_failures;
  for (uint32_t h = 0; h < 0x7c00u && g_failures - before < 10; ++h) {
    const double lo = hvdkeras::HalfToFloat(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00u ? 65536.0 : hvdkeras::HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      CheckHalfAgainstReference(f);
      CheckHalfAgainstReference(-f);
    }
  }
  // ...and a sweep over all float bit patterns.
  for (uint64_t bits = 0; bits <= 0xffffffffull && g_failures - before < 10; bits += 509) {
    CheckHalfAgainstReference(FloatFromBits(static_cast<uint32_t>(bits)));
  }
  g_checks += 1;
}

TEST(BFloat16KnownValuesAndRounding) {
  using hvdkeras::BFloat16ToFloat;
  using hvdkeras::FloatToBFloat16;
  CHECK_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  CHECK_EQ(BFloat16ToFloat(0xc040), -3.0f);
  CHECK_EQ(BFloat16ToFloat(0x7f7f), FloatFromBits(0x7f7f0000u));
  CHECK_EQ(BFloat16ToFloat(0x0001), FloatFromBits(0x00010000u));  // subnormal
  CHECK_EQ(BFloat16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  CHECK(std::isnan(BFloat16ToFloat(0x7fc0)));

  CHECK_EQ(FloatToBFloat16(1.0f), uint16_t{0x3f80});
  CHECK_EQ(FloatToBFloat16(-0.0f), uint16_t{0x8000});
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f808000u)), uint16_t{0x3f80});  // tie -> even
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f818000u)), uint16_t{0x3f82});  // tie -> even
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f808001u)), uint16_t{0x3f81});  // above tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f807fffu)), uint16_t{0x3f80});  // below tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x00008000u)), uint16_t{0x0000});  // subnormal tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x00018000u)), uint16_t{0x0002});
  CHECK_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), uint16_t{0x7f80});  // -> inf
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x7f7f7fffu)), uint16_t{0x7f7f});
  CHECK_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), uint16_t{0x7f80});
  CHECK_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), uint16_t{0xff80});
  // NaNs stay NaN, quiet, sign kept, even when the payload sits in the low bits.
  CHECK(IsBFloatNan(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsBFloatNan(FloatToBFloat16(FloatFromBits(0x7f800001u))));
  CHECK(IsBFloatNan(FloatToBFloat16(FloatFromBits(0xffffffffu))));
  CHECK((FloatToBFloat16(FloatFromBits(0xff800001u)) & 0x8000u) != 0);
  CHECK((FloatToBFloat16(FloatFromBits(0x7f800001u)) & 0x0040u) != 0);
}

TEST(BFloat16RoundTripAndReference) {
  int failures = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = hvdkeras::BFloat16ToFloat(bits);
    const uint16_t back = hvdkeras::FloatToBFloat16(f);
    const bool ok = IsBFloatNan(bits) ? IsBFloatNan(back) : back == bits;
    if (!ok && ++failures <= 5) {
      Fail(__FILE__, __LINE__, "bfloat16 round trip of " + Show(bits) + " gave " + Show(back));
    }
    ++g_checks;
  }
  const int before = g_failures;
  for (uint64_t bits = 0; bits <= 0xffffffffull && g_failures - before < 10; bits += 509) {
    CheckBFloatAgainstReference(FloatFromBits(static_cast<uint32_t>(bits)));
  }
  for (uint32_t b = 0; b < 0x7f80u && g_failures - before < 10; ++b) {  // every tie
    const uint32_t tie = (b << 16) | 0x8000u;
    for (uint32_t t : {tie - 1, tie, tie + 1}) {
      CheckBFloatAgainstReference(FloatFromBits(t));
      CheckBFloatAgainstReference(FloatFromBits(t | 0x80000000u));
    }
  }
}

}  // namespace

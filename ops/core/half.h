// Conversions between float and the two 16-bit float formats, with
// round-to-nearest-even, so reductions of float16/bfloat16 can be computed
// in float precision. The CPU path and the GPU kernels (compiled by NVRTC,
// see portable.h) both use these, so both round alike.
#pragma once

#include "core/portable.h"

namespace hvdkeras {

HVDKERAS_HD inline float BFloat16ToFloat(uint16_t h) {
  return FloatOfBits(static_cast<uint32_t>(h) << 16);
}

HVDKERAS_HD inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = BitsOfFloat(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

HVDKERAS_HD inline float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise it
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3ffu;
      bits = sign | (static_cast<uint32_t>(127 - 15 - shift + 1) << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1fu) {  // inf or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  return FloatOfBits(bits);
}

HVDKERAS_HD inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = BitsOfFloat(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exponent;  // >= 14 here
    uint32_t result = mantissa >> shift;
    uint32_t remainder = mantissa & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return sign | static_cast<uint16_t>(result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>(((rounded - 0x38000000u) >> 13) & 0x7fffu);
}

// Rounds a double to float with "round to odd": truncate, and set the last
// bit if anything was lost. Rounding that float again to a format with at
// least two fewer significand bits then gives the correctly rounded result,
// which a plain double -> float -> half conversion does not (it rounds twice).
HVDKERAS_HD inline float DoubleToFloatRoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || f != f) return f;
  if (AbsDouble(static_cast<double>(f)) > AbsDouble(d)) {
    f = TowardZero(f);  // round toward zero instead
  }
  return FloatOfBits(BitsOfFloat(f) | 1u);
}

HVDKERAS_HD inline uint16_t DoubleToHalf(double d) {
  return FloatToHalf(DoubleToFloatRoundToOdd(d));
}
HVDKERAS_HD inline uint16_t DoubleToBFloat16(double d) {
  return FloatToBFloat16(DoubleToFloatRoundToOdd(d));
}

}  // namespace hvdkeras

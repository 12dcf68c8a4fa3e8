// The arithmetic applied to single elements around a reduction: scaling on
// the way in, averaging and scaling on the way out, and the neutral element
// a joined rank contributes. The CPU path (scaling.cc) and the GPU kernels
// (ops/cuda/kernels.cu, compiled by NVRTC: see portable.h) both use these
// functions, so a GPU result matches the CPU result bit for bit.
#pragma once

#include "core/half.h"
#include "core/portable.h"

namespace hvdkeras {

// Storage types of the two 16-bit float formats (plain bits).
struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

// Reads and writes one element of each storage type as a double, and says
// whether the type is an integer and what its extreme values are.
template <typename T>
struct Element {
  static constexpr bool kInteger = true;
  HVDKERAS_HD static double Load(T v) { return static_cast<double>(v); }
  HVDKERAS_HD static T Store(double v) { return static_cast<T>(v); }
};

template <>
struct Element<float> {
  static constexpr bool kInteger = false;
  HVDKERAS_HD static double Load(float v) { return v; }
  HVDKERAS_HD static float Store(double v) { return static_cast<float>(v); }
};

template <>
struct Element<double> {
  static constexpr bool kInteger = false;
  HVDKERAS_HD static double Load(double v) { return v; }
  HVDKERAS_HD static double Store(double v) { return v; }
};

template <>
struct Element<Half> {
  static constexpr bool kInteger = false;
  HVDKERAS_HD static double Load(Half v) { return HalfToFloat(v.bits); }
  HVDKERAS_HD static Half Store(double v) { return Half{DoubleToHalf(v)}; }
};

template <>
struct Element<BFloat> {
  static constexpr bool kInteger = false;
  HVDKERAS_HD static double Load(BFloat v) { return BFloat16ToFloat(v.bits); }
  HVDKERAS_HD static BFloat Store(double v) { return BFloat{DoubleToBFloat16(v)}; }
};

// The largest and lowest values of the integer types (what Min and Max
// start from), spelled out because NVRTC has no <limits>.
template <typename T>
struct IntegerRange;
#define HVDKERAS_INTEGER_RANGE(type, lowest, largest)            \
  template <>                                                    \
  struct IntegerRange<type> {                                    \
    HVDKERAS_HD static type Lowest() { return (lowest); }        \
    HVDKERAS_HD static type Largest() { return (largest); }      \
  };
HVDKERAS_INTEGER_RANGE(uint8_t, 0, 0xff)
HVDKERAS_INTEGER_RANGE(int8_t, -128, 127)
HVDKERAS_INTEGER_RANGE(uint16_t, 0, 0xffff)
HVDKERAS_INTEGER_RANGE(int16_t, -32768, 32767)
HVDKERAS_INTEGER_RANGE(uint32_t, 0, 0xffffffffu)
HVDKERAS_INTEGER_RANGE(int32_t, -2147483647 - 1, 2147483647)
HVDKERAS_INTEGER_RANGE(uint64_t, 0, 0xffffffffffffffffull)
HVDKERAS_INTEGER_RANGE(int64_t, -9223372036854775807ll - 1, 9223372036854775807ll)
#undef HVDKERAS_INTEGER_RANGE

// src * factor.
template <typename T>
HVDKERAS_HD inline T ScaleElement(T src, double factor) {
  return Element<T>::Store(Element<T>::Load(src) * factor);
}

// src / divisor * factor: the output stage of an allreduce. With factor 1,
// integers divide as integers (rounding toward zero) and floats divide
// rather than multiply by a reciprocal, which is exact whenever the true
// average is representable.
template <typename T, bool kIsInteger = Element<T>::kInteger>
struct Finalize {
  HVDKERAS_HD static T Of(T src, int divisor, double factor) {
    if (factor == 1.0) return Element<T>::Store(Element<T>::Load(src) / divisor);
    return Element<T>::Store(Element<T>::Load(src) / divisor * factor);
  }
};

template <typename T>
struct Finalize<T, true> {
  HVDKERAS_HD static T Of(T src, int divisor, double factor) {
    if (factor == 1.0) return static_cast<T>(src / divisor);
    return Element<T>::Store(Element<T>::Load(src) / divisor * factor);
  }
};

template <typename T>
HVDKERAS_HD inline T FinalizeElement(T src, int divisor, double factor) {
  return Finalize<T>::Of(src, divisor, factor);
}

// What a rank that has joined contributes to a reduction: the element that
// leaves the others' result unchanged. Which one is the reduction's choice,
// made on the host (scaling.h: NeutralKindOf).
enum NeutralKind { kNeutralZero = 0, kNeutralOne = 1, kNeutralLargest = 2, kNeutralLowest = 3 };

template <typename T, bool kIsInteger = Element<T>::kInteger>
struct Neutral {
  HVDKERAS_HD static T Of(int kind) {
    return kind == kNeutralLargest   ? IntegerRange<T>::Largest()
           : kind == kNeutralLowest  ? IntegerRange<T>::Lowest()
           : kind == kNeutralOne     ? static_cast<T>(1)
                                     : static_cast<T>(0);
  }
};

template <typename T>
struct Neutral<T, false> {
  HVDKERAS_HD static T Of(int kind) {
    return Element<T>::Store(kind == kNeutralLargest  ? Infinity()
                             : kind == kNeutralLowest ? -Infinity()
                             : kind == kNeutralOne    ? 1.0
                                                      : 0.0);
  }
};

}  // namespace hvdkeras

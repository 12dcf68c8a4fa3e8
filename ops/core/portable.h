// What the code shared by the host compiler and NVRTC (which compiles the
// GPU kernels at run time, ops/cuda/kernels.cu) needs to compile in both:
// fixed-width integers, bit casts and a few math functions. NVRTC has no
// standard library headers, so under it they come from CUDA's builtins.
#pragma once

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define HVDKERAS_HD __host__ __device__
#else
#define HVDKERAS_HD
#endif

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#endif

namespace hvdkeras {

HVDKERAS_HD inline uint32_t BitsOfFloat(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
#endif
}

HVDKERAS_HD inline float FloatOfBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

HVDKERAS_HD inline double Infinity() {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(0x7ff0000000000000LL);
#else
  return std::numeric_limits<double>::infinity();
#endif
}

HVDKERAS_HD inline double AbsDouble(double d) {
#if defined(__CUDA_ARCH__)
  return fabs(d);
#else
  return std::fabs(d);
#endif
}

// The float next to `f` toward zero (f finite and not zero).
HVDKERAS_HD inline float TowardZero(float f) { return FloatOfBits(BitsOfFloat(f) - 1u); }

}  // namespace hvdkeras

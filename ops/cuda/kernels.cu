// The engine's GPU kernels: batched copies (plain, scaled, or averaged and
// postscaled on their way out of a fused buffer) and the neutral fill of a
// joined rank. Compiled at run time by NVRTC for the GPU in use
// (cuda_kernels.cc), from this file and the core headers it includes, which
// are built into the library as text; the element arithmetic is the CPU
// path's (core/element_ops.h).
#include "core/copy_batch.h"
#include "core/element_ops.h"

namespace hvdkeras {

// The calling thread's first element and the stride of a grid-stride loop
// over one copy (blockIdx.y picks the copy).
__device__ inline int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

template <typename T>
__device__ void CopyScaled(const CopyBatch& batch) {
  const int c = blockIdx.y;
  if (c >= batch.copies) return;
  const T* src = static_cast<const T*>(batch.src[c]);
  T* dst = static_cast<T*>(batch.dst[c]);
  const int64_t n = batch.count[c];
  if (batch.divisor > 1) {
    for (int64_t i = FirstIndex(); i < n; i += Stride()) {
      dst[i] = FinalizeElement(src[i], batch.divisor, batch.factor);
    }
  } else {
    for (int64_t i = FirstIndex(); i < n; i += Stride()) dst[i] = ScaleElement(src[i], batch.factor);
  }
}

template <typename T>
__device__ void FillAll(T* data, int64_t count, int kind) {
  const T value = Neutral<T>::Of(kind);
  for (int64_t i = FirstIndex(); i < count; i += Stride()) data[i] = value;
}

}  // namespace hvdkeras

using namespace hvdkeras;

// A plain copy moves bytes: 16 at a time where both ends allow it.
extern "C" __global__ void hvdkeras_copy_bytes(CopyBatch batch) {
  const int c = blockIdx.y;
  if (c >= batch.copies) return;
  const char* src = static_cast<const char*>(batch.src[c]);
  char* dst = static_cast<char*>(batch.dst[c]);
  const int64_t n = batch.count[c];
  int64_t done = 0;
  const unsigned long long ends = reinterpret_cast<unsigned long long>(src) |
                                  reinterpret_cast<unsigned long long>(dst);
  if ((ends & 15ull) == 0) {
    const int64_t vectors = n / 16;
    const uint4* src4 = reinterpret_cast<const uint4*>(src);
    uint4* dst4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = FirstIndex(); i < vectors; i += Stride()) dst4[i] = src4[i];
    done = vectors * 16;
  }
  for (int64_t i = done + FirstIndex(); i < n; i += Stride()) dst[i] = src[i];
}

// One set of typed kernels per element storage type; the host picks them by
// these suffixes (cuda_kernels.cc: KernelSuffix).
#define HVDKERAS_TYPED_KERNELS(type, suffix)                                              \
  extern "C" __global__ void hvdkeras_copy_scaled_##suffix(CopyBatch batch) {             \
    CopyScaled<type>(batch);                                                              \
  }                                                                                       \
  extern "C" __global__ void hvdkeras_fill_##suffix(void* data, int64_t count, int kind) { \
    FillAll<type>(static_cast<type*>(data), count, kind);                                 \
  }

HVDKERAS_TYPED_KERNELS(uint8_t, u8)
HVDKERAS_TYPED_KERNELS(int8_t, i8)
HVDKERAS_TYPED_KERNELS(uint16_t, u16)
HVDKERAS_TYPED_KERNELS(int16_t, i16)
HVDKERAS_TYPED_KERNELS(uint32_t, u32)
HVDKERAS_TYPED_KERNELS(int32_t, i32)
HVDKERAS_TYPED_KERNELS(uint64_t, u64)
HVDKERAS_TYPED_KERNELS(int64_t, i64)
HVDKERAS_TYPED_KERNELS(Half, f16)
HVDKERAS_TYPED_KERNELS(BFloat, bf16)
HVDKERAS_TYPED_KERNELS(float, f32)
HVDKERAS_TYPED_KERNELS(double, f64)

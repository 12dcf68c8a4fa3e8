// The parameters of one batched-copy launch, laid out identically for the
// host code that fills them (ops/cuda/cuda_device.cc) and for the GPU kernel
// that reads them (ops/cuda/kernels.cu, compiled by NVRTC: see portable.h).
// The launch takes them by value, so a batch is one launch however many
// tensors it copies.
#pragma once

#include "core/portable.h"

namespace hvdkeras {

// How many copies one launch takes: bounded by the size of a kernel's
// parameters (4 KiB on every CUDA GPU).
constexpr int kMaxCopiesPerLaunch = 64;

struct CopyBatch {
  const void* src[kMaxCopiesPerLaunch];
  void* dst[kMaxCopiesPerLaunch];
  // Elements of the launch's dtype (bytes for the plain byte copy).
  int64_t count[kMaxCopiesPerLaunch];
  int32_t copies;
  // dst = src / divisor * factor where divisor > 1 (the output stage of an
  // average), else src * factor.
  int32_t divisor;
  double factor;
};

}  // namespace hvdkeras

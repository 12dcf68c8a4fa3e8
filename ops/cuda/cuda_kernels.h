// The engine's GPU kernels (kernels.cu): compiled by NVRTC for one GPU's
// architecture, loaded into its context, and launched on a stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/device.h"
#include "cuda/cuda_libraries.h"

namespace hvdkeras {
namespace cuda {

// Compiles kernels.cu for `arch` ("sm_90"). Needs NVRTC but no GPU.
Status CompileKernels(const std::string& arch, std::string* cubin);

// The kernels for `arch`: read from the cache when an earlier process kept
// them there, else compiled and kept. No GPU needed.
Status CachedKernels(const std::string& arch, std::string* cubin, bool* from_cache);

// Where compiled kernels are kept between runs ("" : not kept), keyed by
// architecture, NVRTC version and the kernels' source: a process pays for
// NVRTC once per machine instead of at every rank's first GPU collective.
void SetKernelCacheDir(const std::string& dir);

// The kernels loaded into the current context of one GPU.
class Kernels {
 public:
  // Loads the kernels for the current GPU: from the cache when it holds
  // them, else compiled (and then kept in the cache).
  Status Load(const Runtime& rt, const Driver& driver, int device);

  // One launch per kMaxCopiesPerLaunch copies: dst = src / divisor * factor
  // (Device::CopyFinalized's rule) where divisor > 1, else src * factor; a
  // factor and divisor of 1 copy bytes.
  Status CopyScaled(DataType dtype, const std::vector<DeviceCopy>& copies, int divisor,
                    double factor, cudaStream_t stream) const;
  Status Fill(DataType dtype, void* data, int64_t count, int neutral_kind,
              cudaStream_t stream) const;

 private:
  struct Typed {
    CUfunction copy_scaled = nullptr;
    CUfunction fill = nullptr;
  };
  const Typed* TypedFor(DataType dtype) const;
  Status Launch(CUfunction f, int64_t elements, unsigned int copies, void** params,
                cudaStream_t stream) const;

  const Driver* driver_ = nullptr;
  CUfunction copy_bytes_ = nullptr;
  // Indexed by the kernel suffix (KernelSuffix in cuda_kernels.cc).
  std::vector<Typed> typed_;
  int multiprocessors_ = 1;
};

}  // namespace cuda
}  // namespace hvdkeras

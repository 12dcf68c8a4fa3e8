// Registers the CUDA device backend (core/device.h) when this directory is
// compiled in: the CUDA device, NCCL communicators, and what `hvdkeras
// check` reports about them.
#include <cuda.h>
#include <nccl.h>

#include "core/device.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_libraries.h"
#include "cuda/cuda_probe.h"
#include "cuda/nccl_communicator.h"

namespace hvdkeras {
namespace cuda {
namespace {

std::string VersionText(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

std::string BuildInfo() {
  std::string info = "cuda_headers=" + VersionText(CUDA_VERSION) + "\n";
  info += "nccl=" + DescribeNccl() + "\n";
  std::string why;
  const Nvrtc* nvrtc = LoadNvrtc(&why);
  int major = 0, minor = 0;
  if (nvrtc != nullptr) nvrtc->nvrtcVersion(&major, &minor);
  info += "nvrtc=" + (nvrtc ? std::to_string(major) + "." + std::to_string(minor)
                            : "not loadable (" + why + ")") + "\n";
  std::string runtime = LoadedFrom("libcudart.so.12");
  if (runtime.empty()) runtime = LoadedFrom("libcudart.so.13");
  if (!runtime.empty()) info += "cudart_path=" + runtime + "\n";
  const std::string nccl = LoadedFrom("libnccl.so.2");
  if (!nccl.empty()) info += "nccl_path=" + nccl + "\n";
  return info;
}

Device* GetDevice(std::string* why_not) { return CudaDevice::Get(why_not); }

Status Compile(const std::string& arch, int64_t* bytes) {
  std::string cubin;
  bool from_cache = false;
  Status s = CachedKernels(arch, &cubin, &from_cache);
  if (s.ok()) *bytes = static_cast<int64_t>(cubin.size());
  return s;
}

const bool kRegistered = [] {
  DeviceBackend backend;
  backend.name = "cuda";
  backend.device = &GetDevice;
  backend.new_unique_id = &NewNcclId;
  backend.make_communicator = &MakeNcclCommunicator;
  backend.build_info = &BuildInfo;
  backend.set_library_dirs = &SetLibraryDirs;
  backend.set_kernel_cache_dir = &SetKernelCacheDir;
  backend.compile_kernels = &Compile;
  backend.probe_copies = &ProbeCopies;
  RegisterDeviceBackend(backend);
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace hvdkeras

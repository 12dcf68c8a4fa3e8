#include "cuda/cuda_kernels.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

// kKernelSource, kKernelHeaderNames, kKernelHeaderTexts, kKernelHeaderCount:
// kernels.cu and the core headers it includes, as text, generated at build
// time by hvdkeras/engine/cuda_build.py.
#include "cuda_kernel_sources.inc"

namespace hvdkeras {
namespace cuda {

namespace {

constexpr unsigned int kThreadsPerBlock = 256;
// Elements each thread handles (at least) before the grid is widened.
constexpr int64_t kElementsPerThread = 4;

// The kernels.cu suffix of a storage type (bool is stored as uint8).
int KernelIndex(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kBool: return 0;
    case DataType::kInt8: return 1;
    case DataType::kUInt16: return 2;
    case DataType::kInt16: return 3;
    case DataType::kUInt32: return 4;
    case DataType::kInt32: return 5;
    case DataType::kUInt64: return 6;
    case DataType::kInt64: return 7;
    case DataType::kFloat16: return 8;
    case DataType::kBFloat16: return 9;
    case DataType::kFloat32: return 10;
    case DataType::kFloat64: return 11;
  }
  return -1;
}
constexpr const char* kSuffixes[] = {"u8",  "i8",  "u16", "i16", "u32", "i32",
                                     "u64", "i64", "f16", "bf16", "f32", "f64"};
constexpr int kTypedCount = sizeof(kSuffixes) / sizeof(kSuffixes[0]);

Status Failed(const std::string& what) {
  return Status::Error(StatusCode::kPreconditionError, "hvdkeras GPU kernels: " + what);
}

Status DriverStatus(const Driver& driver, CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return Status::OK();
  const char* text = nullptr;
  driver.cuGetErrorString(result, &text);
  return Failed(std::string(what) + " failed: " + (text ? text : "unknown CUDA error"));
}

Status RuntimeStatus(const Runtime& rt, cudaError_t result, const char* what) {
  if (result == cudaSuccess) return Status::OK();
  return Failed(std::string(what) + " failed: " + rt.cudaGetErrorString(result));
}

std::mutex& CacheMutex() {
  static std::mutex mu;
  return mu;
}

std::string& CacheDir() {
  static std::string dir;
  return dir;
}

// FNV-1a: a hash that is the same in every build and process.
uint64_t SourceHash() {
  uint64_t h = 1469598103934665603ull;
  auto add = [&h](const char* text) {
    for (const char* c = text; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // a separator between texts
  };
  add(kKernelSource);
  for (int i = 0; i < kKernelHeaderCount; ++i) {
    add(kKernelHeaderNames[i]);
    add(kKernelHeaderTexts[i]);
  }
  return h;
}

// The cache file for `arch` ("" when there is no cache or no NVRTC).
std::string CachePath(const std::string& arch) {
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(CacheMutex());
    dir = CacheDir();
  }
  std::string why;
  const Nvrtc* nvrtc = LoadNvrtc(&why);
  if (dir.empty() || nvrtc == nullptr) return "";
  int major = 0, minor = 0;
  nvrtc->nvrtcVersion(&major, &minor);
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(SourceHash()));
  return dir + "/kernels-" + arch + "-nvrtc" + std::to_string(major) + "." +
         std::to_string(minor) + "-" + hash + ".cubin";
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return !out->empty();
}

// Writes atomically (a temporary file renamed into place), so ranks that
// compile at the same time never read half a file. Failing is harmless:
// the next process compiles again.
void WriteFile(const std::string& path, const std::string& data) {
  const std::string dir = path.substr(0, path.rfind('/'));
  for (size_t at = 1; at != std::string::npos; at = dir.find('/', at + 1)) {
    mkdir(dir.substr(0, at).c_str(), 0755);
  }
  mkdir(dir.c_str(), 0755);
  const std::string tmp = path + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

void SetKernelCacheDir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(CacheMutex());
  CacheDir() = dir;
}

Status CachedKernels(const std::string& arch, std::string* cubin, bool* from_cache) {
  *from_cache = false;
  const std::string cached = CachePath(arch);
  if (!cached.empty() && ReadFile(cached, cubin)) {
    *from_cache = true;
    return Status::OK();
  }
  Status s = CompileKernels(arch, cubin);
  if (s.ok() && !cached.empty()) WriteFile(cached, *cubin);
  return s;
}

Status CompileKernels(const std::string& arch, std::string* cubin) {
  std::string why;
  const Nvrtc* nvrtc = LoadNvrtc(&why);
  if (nvrtc == nullptr) return Failed("NVRTC is needed to compile them: " + why);
  nvrtcProgram program = nullptr;
  nvrtcResult r = nvrtc->nvrtcCreateProgram(&program, kKernelSource, "kernels.cu",
                                            kKernelHeaderCount, kKernelHeaderTexts,
                                            kKernelHeaderNames);
  if (r != NVRTC_SUCCESS) {
    return Failed(std::string("nvrtcCreateProgram: ") + nvrtc->nvrtcGetErrorString(r));
  }
  const std::string arch_option = "--gpu-architecture=" + arch;
  const char* options[] = {arch_option.c_str(), "--std=c++17"};
  r = nvrtc->nvrtcCompileProgram(program, 2, options);
  Status status = Status::OK();
  if (r != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtc->nvrtcGetProgramLogSize(program, &log_size);
    std::string log(log_size, '\0');
    if (log_size > 0) nvrtc->nvrtcGetProgramLog(program, log.data());
    status = Failed("compiling for " + arch + ": " + nvrtc->nvrtcGetErrorString(r) + "\n" + log);
  } else {
    size_t size = 0;
    nvrtc->nvrtcGetCUBINSize(program, &size);
    cubin->assign(size, '\0');
    r = nvrtc->nvrtcGetCUBIN(program, cubin->data());
    if (r != NVRTC_SUCCESS) {
      status = Failed(std::string("nvrtcGetCUBIN: ") + nvrtc->nvrtcGetErrorString(r));
    }
  }
  nvrtc->nvrtcDestroyProgram(&program);
  return status;
}

Status Kernels::Load(const Runtime& rt, const Driver& driver, int device) {
  driver_ = &driver;
  int major = 0, minor = 0;
  Status s = RuntimeStatus(
      rt, rt.cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
      "reading the compute capability");
  if (s.ok()) {
    s = RuntimeStatus(
        rt, rt.cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
        "reading the compute capability");
  }
  if (s.ok()) {
    s = RuntimeStatus(rt,
                      rt.cudaDeviceGetAttribute(&multiprocessors_,
                                                cudaDevAttrMultiProcessorCount, device),
                      "reading the multiprocessor count");
  }
  if (!s.ok()) return s;
  const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  std::string cubin;
  bool from_cache = false;
  s = CachedKernels(arch, &cubin, &from_cache);
  if (!s.ok()) return s;
  CUmodule module = nullptr;  // kept for the life of the process
  if (driver.cuModuleLoadData(&module, cubin.data()) != CUDA_SUCCESS && from_cache) {
    // A damaged cache entry: compile afresh and replace it.
    module = nullptr;
    s = CompileKernels(arch, &cubin);
    if (!s.ok()) return s;
    const std::string cached = CachePath(arch);
    if (!cached.empty()) WriteFile(cached, cubin);
  }
  if (module == nullptr) {
    s = DriverStatus(driver, driver.cuModuleLoadData(&module, cubin.data()),
                     "loading the kernels");
    if (!s.ok()) return s;
  }
  s = DriverStatus(driver, driver.cuModuleGetFunction(&copy_bytes_, module, "hvdkeras_copy_bytes"),
                   "finding hvdkeras_copy_bytes");
  typed_.assign(kTypedCount, Typed{});
  for (int i = 0; i < kTypedCount && s.ok(); ++i) {
    const std::string suffix = kSuffixes[i];
    s = DriverStatus(driver,
                     driver.cuModuleGetFunction(&typed_[i].copy_scaled, module,
                                                ("hvdkeras_copy_scaled_" + suffix).c_str()),
                     "finding a copy kernel");
    if (s.ok()) {
      s = DriverStatus(driver,
                       driver.cuModuleGetFunction(&typed_[i].fill, module,
                                                  ("hvdkeras_fill_" + suffix).c_str()),
                       "finding a fill kernel");
    }
  }
  return s;
}

const Kernels::Typed* Kernels::TypedFor(DataType dtype) const {
  const int index = KernelIndex(dtype);
  return index >= 0 && index < static_cast<int>(typed_.size()) ? &typed_[index] : nullptr;
}

Status Kernels::Launch(CUfunction f, int64_t elements, unsigned int copies, void** params,
                       cudaStream_t stream) const {
  // Enough blocks to cover the largest copy at kElementsPerThread each,
  // capped so the whole launch stays within a few waves of the GPU.
  const int64_t wanted = (elements + kThreadsPerBlock * kElementsPerThread - 1) /
                         (kThreadsPerBlock * kElementsPerThread);
  const int64_t cap = std::max<int64_t>(1, int64_t{32} * multiprocessors_ / copies);
  const unsigned int blocks = static_cast<unsigned int>(std::clamp<int64_t>(wanted, 1, cap));
  return DriverStatus(*driver_,
                      driver_->cuLaunchKernel(f, blocks, copies, 1, kThreadsPerBlock, 1, 1, 0,
                                              reinterpret_cast<CUstream>(stream), params,
                                              nullptr),
                      "launching a kernel");
}

Status Kernels::CopyScaled(DataType dtype, const std::vector<DeviceCopy>& copies, int divisor,
                           double factor, cudaStream_t stream) const {
  const bool plain = factor == 1.0 && divisor <= 1;
  const Typed* typed = TypedFor(dtype);
  if (!plain && typed == nullptr) return Failed("no kernel for this dtype");
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  for (size_t first = 0; first < copies.size(); first += kMaxCopiesPerLaunch) {
    const size_t n = std::min<size_t>(kMaxCopiesPerLaunch, copies.size() - first);
    CopyBatch batch{};
    batch.copies = static_cast<int32_t>(n);
    batch.divisor = divisor;
    batch.factor = factor;
    int64_t largest = 0;
    for (size_t i = 0; i < n; ++i) {
      const DeviceCopy& c = copies[first + i];
      batch.src[i] = c.src;
      batch.dst[i] = c.dst;
      // A plain copy moves bytes, 16 per thread step.
      batch.count[i] = plain ? c.count * element : c.count;
      largest = std::max(largest, plain ? (batch.count[i] + 15) / 16 : batch.count[i]);
    }
    void* params[] = {&batch};
    Status s = Launch(plain ? copy_bytes_ : typed->copy_scaled, largest,
                      static_cast<unsigned int>(n), params, stream);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status Kernels::Fill(DataType dtype, void* data, int64_t count, int neutral_kind,
                     cudaStream_t stream) const {
  const Typed* typed = TypedFor(dtype);
  if (typed == nullptr) return Failed("no kernel for this dtype");
  void* params[] = {&data, &count, &neutral_kind};
  return Launch(typed->fill, count, 1, params, stream);
}

}  // namespace cuda
}  // namespace hvdkeras

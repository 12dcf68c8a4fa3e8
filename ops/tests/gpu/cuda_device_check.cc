// The CUDA device and NCCL communicator (ops/cuda/) on a real GPU, in one
// process and without MPI or any framework: what a lent GPU machine can
// check even where TensorFlow is not installed. scripts/gpu_check.sh builds
// it from the engine's own sources (tests/gpu_check_build.py) and runs it.
// Each check prints "CHECK <name>: ok <detail>" or "CHECK <name>: FAIL
// <detail>"; measurements print "MEASURE <name>: <value>". Without a
// usable GPU it prints one "NO GPU: <reason>" line and exits 0.
//
//   cuda_device_check [kernel cache directory]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_libraries.h"
#include "cuda/cuda_probe.h"
#include "cuda/nccl_communicator.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::DeviceCopy;
using hvdkeras::DeviceLane;
using hvdkeras::ReduceOp;
using hvdkeras::Status;
namespace cuda = hvdkeras::cuda;

int g_failures = 0;

void Report(const std::string& name, bool ok, const std::string& detail) {
  std::printf("CHECK %s: %s %s\n", name.c_str(), ok ? "ok" : "FAIL", detail.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

void Report(const std::string& name, const Status& s, const std::string& detail = "") {
  Report(name, s.ok(), s.ok() ? detail : s.message);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Whether GPU `ordinal`'s primary context is active in this process.
bool PrimaryContextActive(const cuda::Driver& driver, int ordinal) {
  CUdevice dev;
  unsigned int flags = 0;
  int active = 0;
  if (driver.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) return false;
  if (driver.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS) return false;
  return active != 0;
}

// Copies host floats to a new device buffer (synchronously).
float* ToDevice(const cuda::Runtime& rt, const std::vector<float>& host) {
  void* data = nullptr;
  if (rt.cudaMalloc(&data, host.size() * sizeof(float)) != cudaSuccess) return nullptr;
  rt.cudaMemcpyAsync(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice,
                     nullptr);
  rt.cudaStreamSynchronize(nullptr);
  return static_cast<float*>(data);
}

std::vector<float> ToHost(const cuda::Runtime& rt, const float* data, size_t count) {
  std::vector<float> host(count);
  rt.cudaMemcpyAsync(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  rt.cudaStreamSynchronize(nullptr);
  return host;
}

// The byte sizes of Keras ResNet-50's float32 gradients, in the order of
// its variables: convolutions with biases, batch normalization's gamma and
// beta, the classifier.
std::vector<int64_t> ResNet50GradientBytes() {
  std::vector<int64_t> bytes;
  auto conv = [&](int64_t k, int64_t in, int64_t out) {
    bytes.push_back(4 * k * k * in * out);
    bytes.push_back(4 * out);
  };
  auto norm = [&](int64_t channels) {
    bytes.push_back(4 * channels);
    bytes.push_back(4 * channels);
  };
  conv(7, 3, 64);
  norm(64);
  int64_t in = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  const int blocks[4] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t f = widths[stage];
    for (int b = 0; b < blocks[stage]; ++b) {
      conv(1, in, f);
      norm(f);
      conv(3, f, f);
      norm(f);
      if (b == 0) {  // the shortcut's projection
        conv(1, in, 4 * f);
        norm(4 * f);
      }
      conv(1, f, 4 * f);
      norm(4 * f);
      in = 4 * f;
    }
  }
  bytes.push_back(4 * 2048 * 1000);
  bytes.push_back(4 * 1000);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) cuda::SetKernelCacheDir(argv[1]);
  if (const char* dirs = std::getenv("HVDKERAS_CUDA_LIBRARY_DIRS")) cuda::SetLibraryDirs(dirs);
  std::string why;
  cuda::CudaDevice* device = cuda::CudaDevice::Get(&why);
  const cuda::Runtime* rt = device ? cuda::LoadRuntime(&why) : nullptr;
  const cuda::Driver* driver = rt ? cuda::LoadDriver(&why) : nullptr;
  if (device == nullptr || rt == nullptr || driver == nullptr) {
    std::printf("NO GPU: %s\n", why.c_str());
    return 0;
  }
  std::printf("DEVICE %s\n", device->Describe().c_str());
  const int gpus = device->DeviceCount();
  // The GPU a pinned rank would use: the last one, so that a context on
  // GPU 0 would show.
  const int mine = gpus - 1;
  const DeviceLane lane{mine, 0};

  // No context is made current on the calling thread, and none on GPU 0
  // when this rank's GPU is another one (the device guard restores the
  // thread's context itself, not an ordinal).
  CUcontext before = nullptr, after = nullptr;
  driver->cuCtxGetCurrent(&before);
  auto start = std::chrono::steady_clock::now();
  Status s = device->Prepare(lane);
  const double prepare_seconds = Seconds(start);
  driver->cuCtxGetCurrent(&after);
  Report("prepare the lane (stream, kernels)", s,
         std::to_string(prepare_seconds) + " s on GPU " + std::to_string(mine));
  Report("the caller's context is left as it was", before == after,
         before == nullptr ? "(none before, none after)" : "");
  if (gpus > 1) {
    Report("no context on GPU 0 for a rank on another GPU",
           !PrimaryContextActive(*driver, 0), "");
  }

  // Kernels: compiled once, then read from the cache.
  int major = 0, minor = 0;
  rt->cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, mine);
  rt->cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, mine);
  const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  std::string cubin;
  bool from_cache = false;
  start = std::chrono::steady_clock::now();
  s = cuda::CachedKernels(arch, &cubin, &from_cache);
  const double first = Seconds(start);
  start = std::chrono::steady_clock::now();
  bool second_from_cache = false;
  Status again = cuda::CachedKernels(arch, &cubin, &second_from_cache);
  const double second = Seconds(start);
  Report("kernels for " + arch, s, std::to_string(cubin.size()) + " bytes, " +
                                       (from_cache ? "from the cache" : "compiled") + " in " +
                                       std::to_string(first) + " s");
  if (argc > 1) {
    Report("kernel cache hit", again.ok() && second_from_cache,
           std::to_string(second) + " s the second time");
  }

  // The engine stream's priority is the greatest the GPU offers.
  cudaStream_t stream = nullptr;
  s = device->EngineStream(lane, &stream);
  int least = 0, greatest = 0, priority = 1;
  rt->cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (s.ok()) rt->cudaStreamGetPriority(stream, &priority);
  Report("engine stream at the greatest priority", s.ok() && priority == greatest,
         "priority " + std::to_string(priority) + ", range " + std::to_string(least) + ".." +
             std::to_string(greatest));

  // Batched scaled copies past one launch, odd sizes, then the average's
  // division and postscale as copies, and the neutral fill, checked element
  // by element.
  rt->cudaSetDevice(mine);
  const int copies = 700;  // more than one launch takes
  std::vector<float> host;
  std::vector<size_t> offsets;
  for (int i = 0; i < copies; ++i) {
    offsets.push_back(host.size());
    for (int j = 0; j < 1 + (i * 37) % 301; ++j) host.push_back(static_cast<float>(i + j));
  }
  offsets.push_back(host.size());
  float* src = ToDevice(*rt, host);
  float* dst = ToDevice(*rt, std::vector<float>(host.size(), -1.0f));
  std::vector<DeviceCopy> batch;
  for (int i = 0; i < copies; ++i) {
    batch.push_back({src + offsets[i], dst + offsets[i],
                     static_cast<int64_t>(offsets[i + 1] - offsets[i])});
  }
  s = src && dst ? device->CopyScaled(lane, DataType::kFloat32, batch, 0.5) : Status::Error(
      hvdkeras::StatusCode::kUnknown, "cudaMalloc failed");
  // The average on the way out of a fused buffer, in place, as many copies.
  std::vector<DeviceCopy> in_place;
  for (const DeviceCopy& c : batch) in_place.push_back({c.dst, c.dst, c.count});
  if (s.ok()) s = device->CopyFinalized(lane, DataType::kFloat32, in_place, 4, 3.0);
  if (s.ok()) s = device->Synchronize(lane);
  if (s.ok()) {
    const std::vector<float> out = ToHost(*rt, dst, host.size());
    size_t wrong = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      const float want = host[i] * 0.5f / 4.0f * 3.0f;
      if (std::fabs(out[i] - want) > 1e-5f * std::fabs(want) + 1e-6f) ++wrong;
    }
    Report("scaled copies, average and postscale", wrong == 0,
           std::to_string(host.size()) + " elements in " + std::to_string(copies) +
               " copies, " + std::to_string(wrong) + " wrong");
  } else {
    Report("scaled copies, average and postscale", s);
  }
  s = device->FillNeutral(lane, DataType::kFloat32, ReduceOp::kMin, dst, 1000);
  if (s.ok()) s = device->Synchronize(lane);
  if (s.ok()) {
    const std::vector<float> out = ToHost(*rt, dst, 1000);
    bool all_inf = true;
    for (float v : out) all_inf = all_inf && std::isinf(v) && v > 0;
    Report("neutral fill for min", all_inf, "");
  } else {
    Report("neutral fill for min", s);
  }

  // A one-rank NCCL communicator on the lane's stream: made (non-blocking,
  // bounded), an allreduce and a broadcast, ended in order.
  std::string id;
  s = cuda::NewNcclId(&id);
  std::unique_ptr<hvdkeras::DeviceCommunicator> comm;
  start = std::chrono::steady_clock::now();
  if (s.ok()) s = cuda::MakeNcclCommunicator(id, 0, 1, lane, 60.0, &comm);
  Report("one-rank NCCL communicator", s,
         (comm ? comm->Describe() : std::string()) + " in " + std::to_string(Seconds(start)) +
             " s");
  if (comm) {
    float* data = ToDevice(*rt, std::vector<float>(4096, 2.5f));
    s = comm->Allreduce(data, data, 4096, DataType::kFloat32, ReduceOp::kSum);
    if (s.ok()) s = comm->Broadcast(data, 4096 * sizeof(float), 0);
    if (s.ok()) s = comm->AsyncError();
    if (s.ok()) s = device->Synchronize(lane);
    const std::vector<float> out = ToHost(*rt, data, 4096);
    bool exact = s.ok();
    for (float v : out) exact = exact && v == 2.5f;
    Report("NCCL allreduce and broadcast on the engine stream", exact, s.message);
    // At one rank a reduce-scatter and an allgather are copies: in place,
    // and into a second buffer.
    float* other = ToDevice(*rt, std::vector<float>(4096, 0.0f));
    s = comm->ReduceScatter(data, data, 4096, DataType::kFloat32, ReduceOp::kSum);
    if (s.ok()) s = comm->Allgather(data, other, 4096 * sizeof(float));
    if (s.ok()) s = device->Synchronize(lane);
    const std::vector<float> gathered = ToHost(*rt, other, 4096);
    exact = s.ok();
    for (float v : gathered) exact = exact && v == 2.5f;
    Report("NCCL reduce-scatter and allgather on the engine stream", exact, s.message);
    rt->cudaFree(other);
    start = std::chrono::steady_clock::now();
    comm.reset();
    Report("NCCL communicator ended in order", true, std::to_string(Seconds(start)) + " s");
    rt->cudaFree(data);
  }

  // The fusion pack against one device-to-device copy of the same bytes.
  double results[3] = {0, 0, 0};
  s = cuda::ProbeCopies(64, int64_t{1} << 20, 20, results);
  Report("pack bandwidth probe", s, "");
  if (s.ok()) {
    std::printf("MEASURE packed GB/s: %.1f\nMEASURE plain copy GB/s: %.1f\n"
                "MEASURE scaled GB/s: %.1f\nMEASURE packed / plain: %.2f\n",
                results[0], results[1], results[2], results[1] > 0 ? results[0] / results[1] : 0);
  }
  // The same with a real model's gradient list, ResNet-50's float32
  // gradients (214 tensors, 256 B to 9.4 MB, 25,583,592 weights as Keras
  // counts them): the largest tensors share their launches with many small
  // ones, where the kernel's grid share per copy decides the speed.
  const std::vector<int64_t> resnet = ResNet50GradientBytes();
  s = cuda::ProbePackedCopies(resnet, 20, results);
  Report("pack bandwidth probe, ResNet-50's gradient sizes", s,
         std::to_string(resnet.size()) + " tensors");
  if (s.ok()) {
    std::printf("MEASURE mixed packed GB/s: %.1f\nMEASURE mixed plain copy GB/s: %.1f\n"
                "MEASURE mixed packed / plain: %.2f\n",
                results[0], results[1], results[1] > 0 ? results[0] / results[1] : 0);
  }
  rt->cudaFree(src);
  rt->cudaFree(dst);
  std::printf("%d failures\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

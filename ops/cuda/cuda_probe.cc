// The bandwidth probe behind examples/gpu_bandwidth_probe.py: how fast the
// batched copy kernels pack tensors into a fused buffer and unpack them,
// against the plain device-to-device copy of the same bytes that is their
// ceiling. Timed with CUDA events on the engine stream of GPU 0.
#include "cuda/cuda_probe.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/device_packing.h"
#include "cuda/cuda_device.h"

namespace hvdkeras {
namespace cuda {

namespace {

constexpr int64_t kAlignment = 256;  // as the engine's fused buffers
// Engines use their process set id (>= 0) as their lane.
constexpr int kProbeLane = -1;

// Milliseconds `run` takes on `stream`, per repetition.
template <typename Run>
Status Time(const Runtime& rt, cudaStream_t stream, int iterations, Run run, double* ms) {
  cudaEvent_t start = nullptr, stop = nullptr;
  rt.cudaEventCreateWithFlags(&start, cudaEventDefault);
  rt.cudaEventCreateWithFlags(&stop, cudaEventDefault);
  Status s = run();  // warm-up
  if (s.ok()) rt.cudaEventRecord(start, stream);
  for (int i = 0; i < iterations && s.ok(); ++i) s = run();
  if (s.ok()) rt.cudaEventRecord(stop, stream);
  float elapsed = 0.0f;
  if (s.ok() && (rt.cudaEventSynchronize(stop) != cudaSuccess ||
                 rt.cudaEventElapsedTime(&elapsed, start, stop) != cudaSuccess)) {
    s = Status::Error(StatusCode::kUnknown, "hvdkeras GPU probe: timing failed");
  }
  rt.cudaEventDestroy(start);
  rt.cudaEventDestroy(stop);
  *ms = static_cast<double>(elapsed) / iterations;
  return s;
}

}  // namespace

Status ProbeCopies(int tensors, int64_t bytes_each, int iterations, double results[3]) {
  if (tensors < 1 || bytes_each < 4 || bytes_each % 4 != 0) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "hvdkeras GPU probe: give tensors >= 1, bytes_each a multiple of 4, "
                         "iterations >= 1");
  }
  return ProbePackedCopies(std::vector<int64_t>(tensors, bytes_each), iterations, results);
}

Status ProbePackedCopies(const std::vector<int64_t>& sizes, int iterations, double results[3]) {
  std::string why;
  CudaDevice* device = CudaDevice::Get(&why);
  const Runtime* rt = LoadRuntime(&why);
  if (device == nullptr || rt == nullptr) {
    return Status::Error(StatusCode::kPreconditionError, "hvdkeras GPU probe: " + why);
  }
  const bool whole_floats = std::all_of(sizes.begin(), sizes.end(),
                                        [](int64_t b) { return b >= 4 && b % 4 == 0; });
  if (sizes.empty() || !whole_floats || iterations < 1) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "hvdkeras GPU probe: give one or more sizes, each a multiple of 4 "
                         "bytes, and iterations >= 1");
  }
  // A lane of its own on this rank's GPU (pinned, or the one it used), so a
  // probe never queues on an engine's, and the caller's context back after.
  const Driver* driver = LoadDriver(&why);
  if (driver == nullptr) {
    return Status::Error(StatusCode::kPreconditionError, "hvdkeras GPU probe: " + why);
  }
  ContextGuard guard(*driver);
  const DeviceLane probe{DefaultDevice() < device->DeviceCount() ? DefaultDevice() : 0,
                         kProbeLane};
  cudaStream_t stream = nullptr;
  Status s = device->EngineStream(probe, &stream);
  if (!s.ok()) return s;
  const PackingPlan plan = PlanPacking(sizes, kAlignment, kMaxCopiesPerLaunch);
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  void* inputs = nullptr;
  void* outputs = nullptr;
  void* fused = nullptr;
  if (rt->cudaMalloc(&inputs, total) != cudaSuccess ||
      rt->cudaMalloc(&outputs, total) != cudaSuccess ||
      rt->cudaMalloc(&fused, plan.total_bytes) != cudaSuccess) {
    s = Status::Error(StatusCode::kPreconditionError, "hvdkeras GPU probe: out of GPU memory");
  }
  std::vector<DeviceCopy> in, out;
  int64_t at = 0;  // where tensor i starts in the inputs and outputs
  for (size_t i = 0; i < sizes.size() && s.ok(); ++i) {
    char* slot = static_cast<char*>(fused) + plan.offsets[i];
    in.push_back({static_cast<char*>(inputs) + at, slot, sizes[i] / 4});
    out.push_back({slot, static_cast<char*>(outputs) + at, sizes[i] / 4});
    at += sizes[i];
  }
  auto pack_and_unpack = [&](double factor) {
    return [&, factor]() {
      Status r = device->CopyScaled(probe, DataType::kFloat32, in, factor);
      return r.ok() ? device->CopyScaled(probe, DataType::kFloat32, out, factor) : r;
    };
  };
  auto plain = [&]() {
    cudaError_t e = rt->cudaMemcpyAsync(fused, inputs, total, cudaMemcpyDeviceToDevice, stream);
    if (e == cudaSuccess) {
      e = rt->cudaMemcpyAsync(outputs, fused, total, cudaMemcpyDeviceToDevice, stream);
    }
    return e == cudaSuccess ? Status::OK()
                            : Status::Error(StatusCode::kUnknown, "hvdkeras GPU probe: copy failed");
  };
  double ms[3] = {0, 0, 0};
  if (s.ok()) s = Time(*rt, stream, iterations, pack_and_unpack(1.0), &ms[0]);
  if (s.ok()) s = Time(*rt, stream, iterations, plain, &ms[1]);
  if (s.ok()) s = Time(*rt, stream, iterations, pack_and_unpack(0.5), &ms[2]);
  for (int i = 0; i < 3; ++i) {
    // Bytes moved (each copy reads and writes `total` twice: in and out).
    results[i] = ms[i] > 0 ? 2.0 * 2.0 * static_cast<double>(total) / (ms[i] * 1e6) : 0.0;
  }
  // Bounded, like every wait of the engine's; memory a stream that did not
  // finish might still use is left to the process's end.
  const Status finished = device->Synchronize(probe);
  if (finished.ok()) {
    for (void* p : {inputs, outputs, fused}) {
      if (p != nullptr) rt->cudaFree(p);
    }
  }
  // The probe's lane (its stream and scratch memory) goes with it.
  device->ReleaseLane(kProbeLane);
  return s.ok() ? finished : s;
}

}  // namespace cuda
}  // namespace hvdkeras

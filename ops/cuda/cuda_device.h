// The Device (core/device.h) on CUDA GPUs: one engine stream per GPU, pooled
// events for the stream order of Note [stream order], stream-ordered scratch
// memory, and the kernels of kernels.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_libraries.h"

namespace hvdkeras {
namespace cuda {

class CudaDevice : public Device {
 public:
  // The process's device, or null with the reason when CUDA has no usable
  // GPU here (no driver, no device). Made once; never destroyed, because
  // the CUDA libraries may already be gone when static objects are.
  static CudaDevice* Get(std::string* why_not);

  std::string Describe() const override;
  int DeviceCount() const override { return count_; }
  std::string Identity(int device) const override;
  Status PointerDevice(const void* data, int* device) const override;
  Status RecordReady(int device, void* framework_stream, void** event) override;
  void Discard(void* event) override;
  Status WaitFor(int device, void* event) override;
  Status WaitForStream(int device, void* framework_stream) override;
  Status Release(int device, void* framework_stream) override;
  Status Scratch(int device, int slot, int64_t bytes, void** data) override;
  Status CopyScaled(int device, DataType dtype, const std::vector<DeviceCopy>& copies,
                    double factor) override;
  Status Finalize(int device, DataType dtype, void* data, int64_t count, int divisor,
                  double factor) override;
  Status FillNeutral(int device, DataType dtype, ReduceOp op, void* data,
                     int64_t count) override;
  Status Zero(int device, void* data, int64_t bytes) override;

  // The engine stream of `device` (made on first use), for the communicator.
  Status EngineStream(int device, cudaStream_t* stream);
  // Waits until the engine stream of `device` has finished: only when the
  // engine shuts down, never on the hot path.
  Status Drain(int device);

 private:
  struct ScratchBuffer {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  // What the engine keeps per GPU; made on the engine thread's first use.
  struct PerGpu {
    cudaStream_t stream = nullptr;
    Kernels kernels;
    std::vector<ScratchBuffer> scratch;
    // Stream-ordered allocation (cudaMallocAsync) is available; without it
    // growing scratch waits for the engine stream (rare, and only on growth).
    bool async_memory = true;
    bool ready = false;
  };

  CudaDevice(const Runtime* rt, const Driver* driver, int count)
      : rt_(rt), driver_(driver), count_(count) {}
  Status Check(cudaError_t result, const char* what) const;
  Status Grow(PerGpu& g, ScratchBuffer& buffer, int64_t bytes);
  // Makes `device` current on the calling thread and its state ready.
  Status Enter(int device, PerGpu** gpu);
  // Events are pooled per GPU: taken on framework threads or the engine's,
  // and given back on the engine's once a stream has been made to wait.
  struct PooledEvent {
    cudaEvent_t event = nullptr;
    int device = 0;
  };
  Status TakeEvent(int device, PooledEvent** event);
  void GiveEvent(PooledEvent* event);
  // `waiter` waits for everything queued on `signaller` now.
  Status Order(int device, cudaStream_t signaller, cudaStream_t waiter);

  const Runtime* rt_;
  const Driver* driver_;
  const int count_;
  std::mutex gpus_mu_;
  std::vector<std::unique_ptr<PerGpu>> gpus_;
  std::mutex events_mu_;
  std::vector<PooledEvent*> free_events_;
};

}  // namespace cuda
}  // namespace hvdkeras

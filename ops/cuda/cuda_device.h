// The Device (core/device.h) on CUDA GPUs: a stream and stream-ordered
// scratch memory per lane of each GPU (Note [device lanes]), pooled events
// for the stream order of Note [stream order], and the kernels of
// kernels.cu, loaded once per GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

#include "core/device.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_libraries.h"

namespace hvdkeras {
namespace cuda {

// Restores the calling thread's current CUDA context on scope exit:
// framework threads record events on their own GPU's streams and must find
// their context as they left it. The context itself is saved, not the
// device ordinal: cudaGetDevice answers 0 on a thread that never chose a
// GPU, and restoring that with cudaSetDevice(0) would open a context on
// GPU 0 in every process (about 0.5 GB each, and "device busy" for rank 0
// under exclusive-process mode). Restoring no context costs nothing.
class ContextGuard {
 public:
  explicit ContextGuard(const Driver& driver) : driver_(driver) {
    saved_ = driver_.cuCtxGetCurrent(&previous_) == CUDA_SUCCESS;
  }
  ~ContextGuard() {
    if (saved_) driver_.cuCtxSetCurrent(previous_);
  }

 private:
  const Driver& driver_;
  CUcontext previous_ = nullptr;
  bool saved_ = false;
};

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
  Status Prepare(const DeviceLane& where) override;
  Status WaitFor(const DeviceLane& where, void* event) override;
  Status WaitForStream(const DeviceLane& where, void* framework_stream) override;
  Status Release(const DeviceLane& where, void* framework_stream) override;
  Status Synchronize(const DeviceLane& where) override;
  Status Scratch(const DeviceLane& where, int slot, int64_t bytes, void** data) override;
  Status CopyScaled(const DeviceLane& where, DataType dtype, const std::vector<DeviceCopy>& copies,
                    double factor) override;
  Status CopyFinalized(const DeviceLane& where, DataType dtype,
                       const std::vector<DeviceCopy>& copies, int divisor, double factor) override;
  Status FillNeutral(const DeviceLane& where, DataType dtype, ReduceOp op, void* data,
                     int64_t count) override;
  Status Zero(const DeviceLane& where, void* data, int64_t bytes) override;
  void ReleaseLane(int lane) override;
  Status MarkTime(const DeviceLane& where, void** mark) override;
  Status MarkedTime(void* mark, bool* reached,
                    std::chrono::steady_clock::time_point* when) override;
  void ReleaseMark(void* mark) override;

  // The stream of the lane `where` (made on first use), for the communicator.
  Status EngineStream(const DeviceLane& where, cudaStream_t* stream);

 private:
  struct ScratchBuffer {
    void* data = nullptr;
    int64_t bytes = 0;
  };
  // What the GPU shares between lanes, made once (under gpus_mu_): the
  // context and the kernels.
  struct PerGpu {
    Kernels kernels;
    // Stream-ordered allocation (cudaMallocAsync) is available; without it
    // growing scratch waits for the lane's stream (rare, and only on growth).
    bool async_memory = true;
    bool ready = false;
  };
  // Note [device time] in core/device.h: an event the lane's stream reached
  // at `host_time`; marks measure from it. Shared by the marks made from it.
  struct Anchor {
    const Runtime* rt = nullptr;
    cudaEvent_t event = nullptr;
    std::chrono::steady_clock::time_point host_time;
    ~Anchor() {
      if (event != nullptr) rt->cudaEventDestroy(event);
    }
  };
  struct Mark {
    cudaEvent_t event = nullptr;
    std::shared_ptr<Anchor> anchor;
  };
  // What one engine's lane keeps on a GPU; used by that engine's thread only.
  struct PerLane {
    PerGpu* gpu = nullptr;
    cudaStream_t stream = nullptr;
    std::vector<ScratchBuffer> scratch;
    std::shared_ptr<Anchor> anchor;
  };

  CudaDevice(const Runtime* rt, const Driver* driver, int count)
      : rt_(rt), driver_(driver), count_(count) {}
  Status Check(cudaError_t result, const char* what) const;
  // OK once `stream` has finished everything queued; an error when it met
  // one or is still busy after `seconds` (a bounded cudaStreamSynchronize:
  // no wait of the engine's is unbounded).
  Status Finish(cudaStream_t stream, double seconds) const;
  Status Grow(PerLane& lane, ScratchBuffer& buffer, int64_t bytes);
  // Makes `where.device` current on the calling thread and the lane ready.
  Status Enter(const DeviceLane& where, PerLane** lane);
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
  std::mutex gpus_mu_;  // guards the tables below (not the lanes' contents)
  std::vector<std::unique_ptr<PerGpu>> gpus_;
  std::map<std::pair<int, int>, std::unique_ptr<PerLane>> lanes_;  // (device, lane)
  std::mutex events_mu_;
  std::vector<PooledEvent*> free_events_;
};

}  // namespace cuda
}  // namespace hvdkeras

#include "cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/scaling.h"

namespace hvdkeras {
namespace cuda {

namespace {

// Scratch grows in steps of this at least, so a slowly growing batch does
// not reallocate every step.
constexpr int64_t kScratchGranule = int64_t{4} << 20;

// How long a removed lane's stream may take to finish before its memory is
// left to the process's end instead.
constexpr double kLaneDrainSeconds = 10.0;


}  // namespace

CudaDevice* CudaDevice::Get(std::string* why_not) {
  static std::mutex mu;
  static CudaDevice* device = nullptr;
  static std::string reason;
  std::lock_guard<std::mutex> lock(mu);
  if (device == nullptr && reason.empty()) {
    std::string why;
    const Runtime* rt = LoadRuntime(&why);
    const Driver* driver = rt ? LoadDriver(&why) : nullptr;
    int count = 0;
    if (rt == nullptr) {
      reason = "the CUDA runtime could not be loaded: " + why;
    } else if (driver == nullptr) {
      reason = "no NVIDIA driver is installed (libcuda.so.1 was not found)";
    } else if (driver->cuInit(0) != CUDA_SUCCESS) {
      reason = "the NVIDIA driver did not start (is one installed?)";
    } else if (cudaError_t e = rt->cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
      reason = e != cudaSuccess ? std::string("CUDA found no GPU: ") + rt->cudaGetErrorString(e)
                                : std::string("CUDA found no GPU");
    } else {
      device = new CudaDevice(rt, driver, count);
    }
  }
  if (device == nullptr && why_not != nullptr) *why_not = reason;
  return device;
}

std::string CudaDevice::Describe() const {
  int runtime = 0, driver = 0;
  rt_->cudaRuntimeGetVersion(&runtime);
  rt_->cudaDriverGetVersion(&driver);
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  std::string out = "CUDA runtime " + version(runtime) + ", driver " + version(driver) + ", " +
                    std::to_string(count_) + (count_ == 1 ? " GPU" : " GPUs");
  for (int i = 0; i < count_; ++i) {
    CUdevice dev;
    char name[256] = {0};
    if (driver_->cuDeviceGet(&dev, i) == CUDA_SUCCESS &&
        driver_->cuDeviceGetName(name, sizeof(name) - 1, dev) == CUDA_SUCCESS) {
      out += std::string(i == 0 ? ": " : "; ") + std::to_string(i) + " " + name;
    }
  }
  return out;
}

std::string CudaDevice::Identity(int device) const {
  char bus[64] = {0};
  if (rt_->cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device) != cudaSuccess) {
    return "GPU " + std::to_string(device);
  }
  return std::string("GPU at PCI ") + bus;
}

Status CudaDevice::PointerDevice(const void* data, int* device) const {
  cudaPointerAttributes attributes{};
  Status s = Check(rt_->cudaPointerGetAttributes(&attributes, data), "cudaPointerGetAttributes");
  if (!s.ok()) return s;
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "hvdkeras GPU: a buffer handed to a GPU collective is not GPU memory");
  }
  *device = attributes.device;
  return Status::OK();
}

Status CudaDevice::Check(cudaError_t result, const char* what) const {
  if (result == cudaSuccess) return Status::OK();
  std::string message = std::string("hvdkeras GPU: ") + what + " failed: " +
                        rt_->cudaGetErrorString(result);
  if (result == cudaErrorMemoryAllocation) {
    message += ". TensorFlow may hold all GPU memory: call hvdkeras.pin_gpu() before building "
               "the model (it turns on memory growth) or set TF_FORCE_GPU_ALLOW_GROWTH=true.";
  }
  return Status::Error(StatusCode::kPreconditionError, message);
}

Status CudaDevice::Enter(const DeviceLane& where, PerLane** lane) {
  const int device = where.device;
  if (device < 0 || device >= count_) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "hvdkeras GPU: device " + std::to_string(device) + " does not exist (" +
                             std::to_string(count_) + " visible)");
  }
  Status s = Check(rt_->cudaSetDevice(device), "selecting the GPU");
  if (!s.ok()) return s;
  // Engine threads (one per process set), pin_gpu()'s warm-up and the
  // bandwidth probe may all get here; the tables are shared, each lane's
  // contents belong to its engine thread.
  std::lock_guard<std::mutex> lock(gpus_mu_);
  if (gpus_.empty()) gpus_.resize(count_);
  if (!gpus_[device]) gpus_[device] = std::make_unique<PerGpu>();
  PerGpu& g = *gpus_[device];
  if (!g.ready) {
    s = Check(rt_->cudaFree(nullptr), "starting the GPU context");
    int pools = 0;
    if (s.ok() && rt_->cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device) ==
                      cudaSuccess) {
      g.async_memory = pools != 0;
    }
    if (s.ok()) s = g.kernels.Load(*rt_, *driver_, device);
    if (!s.ok()) return s;
    g.ready = true;
  }
  std::unique_ptr<PerLane>& entry = lanes_[{device, where.lane}];
  if (!entry) {
    auto made = std::make_unique<PerLane>();
    made->gpu = &g;
    // The greatest priority the GPU offers: collectives and their packing
    // kernels go ahead of the framework's backward kernels queued at the
    // default priority, so a step's reductions start as soon as they can.
    int least = 0, greatest = 0;
    if (rt_->cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) greatest = 0;
    s = Check(rt_->cudaStreamCreateWithPriority(&made->stream, cudaStreamNonBlocking, greatest),
              "creating the engine stream");
    if (!s.ok()) return s;
    entry = std::move(made);
  }
  *lane = entry.get();
  return Status::OK();
}

Status CudaDevice::Prepare(const DeviceLane& where) {
  ContextGuard guard(*driver_);  // may run on a framework thread (pin_gpu)
  PerLane* lane = nullptr;
  return Enter(where, &lane);
}

Status CudaDevice::EngineStream(const DeviceLane& where, cudaStream_t* stream) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  if (s.ok()) *stream = lane->stream;
  return s;
}

Status CudaDevice::Finish(cudaStream_t stream, double seconds) const {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  while (true) {
    const cudaError_t e = rt_->cudaStreamQuery(stream);
    if (e == cudaSuccess) return Status::OK();
    if (e != cudaErrorNotReady) return Check(e, "finishing the engine stream");
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Error(StatusCode::kAborted,
                           "the engine's GPU stream did not finish what it had queued within " +
                               std::to_string(static_cast<int>(seconds)) +
                               " s (a communicator call waiting for a rank that stopped?)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CudaDevice::ReleaseLane(int lane) {
  ContextGuard guard(*driver_);  // the caller's context stays current
  std::vector<std::unique_ptr<PerLane>> gone;
  std::vector<int> devices;
  {
    std::lock_guard<std::mutex> lock(gpus_mu_);
    for (auto it = lanes_.begin(); it != lanes_.end();) {
      if (it->first.second == lane) {
        devices.push_back(it->first.first);
        gone.push_back(std::move(it->second));
        it = lanes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (size_t i = 0; i < gone.size(); ++i) {
    PerLane& l = *gone[i];
    if (rt_->cudaSetDevice(devices[i]) != cudaSuccess) continue;
    // The lane's engine has stopped and its communicator is gone, so what
    // it queued ends soon; memory a stream might still use is left alone.
    if (!Finish(l.stream, kLaneDrainSeconds).ok()) continue;
    for (ScratchBuffer& b : l.scratch) {
      if (b.data != nullptr) rt_->cudaFree(b.data);
    }
    rt_->cudaStreamDestroy(l.stream);
  }
}

Status CudaDevice::MarkTime(const DeviceLane& where, void** mark) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  if (!s.ok()) return s;
  // Re-anchor on an idle stream: an event recorded there is reached at once.
  if (!lane->anchor || rt_->cudaStreamQuery(lane->stream) == cudaSuccess) {
    auto anchor = std::make_shared<Anchor>();
    anchor->rt = rt_;
    s = Check(rt_->cudaEventCreateWithFlags(&anchor->event, cudaEventDefault),
              "creating a timing event");
    if (s.ok()) s = Check(rt_->cudaEventRecord(anchor->event, lane->stream), "recording an event");
    if (!s.ok()) return s;
    anchor->host_time = std::chrono::steady_clock::now();
    lane->anchor = std::move(anchor);
  }
  auto made = std::make_unique<Mark>();
  made->anchor = lane->anchor;
  s = Check(rt_->cudaEventCreateWithFlags(&made->event, cudaEventDefault),
            "creating a timing event");
  if (s.ok()) s = Check(rt_->cudaEventRecord(made->event, lane->stream), "recording an event");
  if (!s.ok()) {
    if (made->event != nullptr) rt_->cudaEventDestroy(made->event);
    return s;
  }
  *mark = made.release();
  return Status::OK();
}

Status CudaDevice::MarkedTime(void* mark, bool* reached,
                              std::chrono::steady_clock::time_point* when) {
  const Mark* m = static_cast<const Mark*>(mark);
  const cudaError_t state = rt_->cudaEventQuery(m->event);
  *reached = state == cudaSuccess;
  if (state == cudaErrorNotReady) return Status::OK();
  if (state != cudaSuccess) return Check(state, "reading a timing event");
  float ms = 0;
  Status s = Check(rt_->cudaEventElapsedTime(&ms, m->anchor->event, m->event),
                   "reading a timing event");
  if (s.ok()) {
    *when = m->anchor->host_time + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                       std::chrono::duration<double, std::milli>(ms));
  }
  return s;
}

void CudaDevice::ReleaseMark(void* mark) {
  Mark* m = static_cast<Mark*>(mark);
  if (m->event != nullptr) rt_->cudaEventDestroy(m->event);
  delete m;
}

Status CudaDevice::Synchronize(const DeviceLane& where) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  return s.ok() ? Finish(lane->stream, kDeviceWaitSeconds) : s;
}

Status CudaDevice::TakeEvent(int device, PooledEvent** event) {
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    for (size_t i = 0; i < free_events_.size(); ++i) {
      if (free_events_[i]->device != device) continue;
      *event = free_events_[i];
      free_events_.erase(free_events_.begin() + static_cast<std::ptrdiff_t>(i));
      return Status::OK();
    }
  }
  auto made = std::make_unique<PooledEvent>();
  made->device = device;
  Status s = Check(rt_->cudaEventCreateWithFlags(&made->event, cudaEventDisableTiming),
                   "creating an event");
  if (s.ok()) *event = made.release();
  return s;
}

void CudaDevice::GiveEvent(PooledEvent* event) {
  std::lock_guard<std::mutex> lock(events_mu_);
  free_events_.push_back(event);
}

Status CudaDevice::RecordReady(int device, void* framework_stream, void** event) {
  ContextGuard guard(*driver_);
  Status s = Check(rt_->cudaSetDevice(device), "selecting the GPU");
  PooledEvent* e = nullptr;
  if (s.ok()) s = TakeEvent(device, &e);
  if (!s.ok()) return s;
  s = Check(rt_->cudaEventRecord(e->event, static_cast<cudaStream_t>(framework_stream)),
            "recording an event");
  if (!s.ok()) {
    GiveEvent(e);
    return s;
  }
  *event = e;
  return Status::OK();
}

void CudaDevice::Discard(void* event) { GiveEvent(static_cast<PooledEvent*>(event)); }

Status CudaDevice::WaitFor(const DeviceLane& where, void* event) {
  PooledEvent* e = static_cast<PooledEvent*>(event);
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  // The wait binds to the event's latest record now, so the event can be
  // reused at once.
  if (s.ok()) s = Check(rt_->cudaStreamWaitEvent(lane->stream, e->event, 0), "waiting for inputs");
  GiveEvent(e);
  return s;
}

Status CudaDevice::Order(int device, cudaStream_t signaller, cudaStream_t waiter) {
  PooledEvent* e = nullptr;
  Status s = TakeEvent(device, &e);
  if (!s.ok()) return s;
  s = Check(rt_->cudaEventRecord(e->event, signaller), "recording an event");
  if (s.ok()) s = Check(rt_->cudaStreamWaitEvent(waiter, e->event, 0), "ordering streams");
  GiveEvent(e);
  return s;
}

Status CudaDevice::WaitForStream(const DeviceLane& where, void* framework_stream) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  return s.ok() ? Order(where.device, static_cast<cudaStream_t>(framework_stream), lane->stream)
                : s;
}

Status CudaDevice::Release(const DeviceLane& where, void* framework_stream) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  return s.ok() ? Order(where.device, lane->stream, static_cast<cudaStream_t>(framework_stream))
                : s;
}

Status CudaDevice::Grow(PerLane& lane, ScratchBuffer& buffer, int64_t bytes) {
  const PerGpu& g = *lane.gpu;
  const int64_t grown = std::max(bytes, buffer.bytes + buffer.bytes / 2);
  const int64_t wanted = (grown + kScratchGranule - 1) / kScratchGranule * kScratchGranule;
  Status s = Status::OK();
  if (!g.async_memory) {
    // Bounded: the stream may hold a communicator call whose peer stopped.
    s = Finish(lane.stream, kDeviceWaitSeconds);
  }
  if (s.ok() && buffer.data != nullptr) {
    // Stream-ordered on the lane's own stream, the only one that uses this
    // buffer: the old buffer is freed after the work queued on it.
    s = Check(g.async_memory ? rt_->cudaFreeAsync(buffer.data, lane.stream)
                             : rt_->cudaFree(buffer.data),
              "freeing GPU scratch memory");
    buffer = {};
  }
  if (!s.ok()) return s;
  s = Check(g.async_memory
                ? rt_->cudaMallocAsync(&buffer.data, static_cast<size_t>(wanted), lane.stream)
                : rt_->cudaMalloc(&buffer.data, static_cast<size_t>(wanted)),
            "allocating GPU scratch memory");
  if (s.ok()) buffer.bytes = wanted;
  return s;
}

Status CudaDevice::Scratch(const DeviceLane& where, int slot, int64_t bytes, void** data) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  if (!s.ok()) return s;
  if (static_cast<int>(lane->scratch.size()) <= slot) lane->scratch.resize(slot + 1);
  ScratchBuffer& buffer = lane->scratch[slot];
  if (buffer.bytes < bytes) {
    s = Grow(*lane, buffer, bytes);
    if (!s.ok()) return s;
  }
  *data = buffer.data;
  return Status::OK();
}

Status CudaDevice::CopyScaled(const DeviceLane& where, DataType dtype,
                              const std::vector<DeviceCopy>& copies, double factor) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  return s.ok() ? lane->gpu->kernels.CopyScaled(dtype, copies, 1, factor, lane->stream) : s;
}

Status CudaDevice::CopyFinalized(const DeviceLane& where, DataType dtype,
                                 const std::vector<DeviceCopy>& copies, int divisor,
                                 double factor) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  return s.ok() ? lane->gpu->kernels.CopyScaled(dtype, copies, divisor, factor, lane->stream) : s;
}

Status CudaDevice::FillNeutral(const DeviceLane& where, DataType dtype, ReduceOp op, void* data,
                               int64_t count) {
  const NeutralKind kind = NeutralKindOf(op);
  if (kind == kNeutralZero) {
    return Zero(where, data, count * static_cast<int64_t>(DataTypeSize(dtype)));
  }
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  if (!s.ok() || count == 0) return s;
  return lane->gpu->kernels.Fill(dtype, data, count, kind, lane->stream);
}

Status CudaDevice::Zero(const DeviceLane& where, void* data, int64_t bytes) {
  PerLane* lane = nullptr;
  Status s = Enter(where, &lane);
  if (!s.ok() || bytes == 0) return s;
  return Check(rt_->cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), lane->stream),
               "zeroing GPU memory");
}

}  // namespace cuda
}  // namespace hvdkeras

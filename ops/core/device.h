// The engine's window onto GPUs: a Device (memory, streams, events, batched
// copies with scaling) and a DeviceCommunicator (the collectives between all
// ranks' GPUs). The CUDA and NCCL implementations (ops/cuda/) register
// factories when they are compiled in; the engine includes no CUDA or NCCL
// header, and a CPU-only build has no factory.
//
// Note [stream order]
// ~~~~~~~~~~~~~~~~~~~
// GPU collectives never block the host. When an op is queued (framework
// thread), the device records an event on the framework's stream: the
// inputs are ready once the stream reaches it. The engine's own stream waits
// for that event, then runs the copies and the communicator's collective,
// all stream-ordered. Outputs the engine allocates later (allgather,
// alltoall, reducescatter) come from the framework's allocator, so the
// engine stream also waits for the framework stream's work up to that
// allocation before writing them. When a batch is queued, every framework
// stream involved waits (cudaStreamWaitEvent, no host wait) for an event
// recorded on the engine stream, and only then is the op's done callback
// called: everything the framework runs on its stream afterwards sees the
// results. collective_device_*.cc follow this order; ops/cuda implements it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/copy_batch.h"

namespace hvdkeras {

// The longest one communicator call (making it included) waits on the
// host for its peers (Note [bounded NCCL calls] in ops/cuda), and the
// longest the host waits for a lane's stream to finish what it queued. The
// ranks reach an agreed call within moments of each other, so this needs
// far less than the stall bound, which is sized for one rank's slow step; a
// stall bound set lower lowers the communicator's (DeviceWaitSeconds in
// device_session.h).
constexpr double kDeviceWaitSeconds = 300.0;

// Note [device lanes]
// ~~~~~~~~~~~~~~~~~~~
// A process has one Device, but every engine (one per process set, each on
// its own thread: Note [process set engines] in engine.h) queues its GPU
// work on a lane of its own: a stream and scratch memory of its own on each
// GPU. So two sets never write one fused buffer, never free memory the
// other's stream still uses, and each set's communicator calls are ordered
// on its own stream (two communicators sharing one stream, enqueued in
// different orders on different ranks, would deadlock). What is shared
// (the loaded kernels, the event pool) is made once under a lock.
struct DeviceLane {
  int device = -1;  // the GPU (CUDA ordinal in this process)
  int lane = 0;     // the engine's process set id
};

// One element-wise copy: `count` elements from src to dst.
struct DeviceCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t count = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // What the runtime is ("CUDA runtime 12.5, driver 12.8, 2 GPUs: ...").
  virtual std::string Describe() const = 0;
  // How many GPUs this process sees.
  virtual int DeviceCount() const = 0;
  // What tells `device` apart from the host's other GPUs whatever each
  // process's numbering (its PCI address): two ranks of one host must not
  // share a GPU.
  virtual std::string Identity(int device) const = 0;
  // The GPU whose memory `data` lies in (for buffers handed over without
  // their device, as XLA's custom calls hand them).
  virtual Status PointerDevice(const void* data, int* device) const = 0;

  // Framework thread: an event marking the work queued on `framework_stream`
  // so far. Released by WaitFor.
  virtual Status RecordReady(int device, void* framework_stream, void** event) = 0;

  // Releases an event from RecordReady that will not be waited for (its op
  // failed before running).
  virtual void Discard(void* event) = 0;

  // Makes `where` ready: its stream, the GPU's kernels (compiled or read
  // from the cache). Everything that can fail locally when a GPU is first
  // used happens here, before the ranks make their communicator together.
  // Any thread; a second call does nothing.
  virtual Status Prepare(const DeviceLane& where) = 0;

  // Engine thread; everything below is queued on the stream of the lane
  // `where` (Note [device lanes]) and returns without waiting for the GPU.
  // The lane's stream waits for `event` (from RecordReady), then releases it.
  virtual Status WaitFor(const DeviceLane& where, void* event) = 0;
  // The lane's stream waits for everything queued on `framework_stream` now.
  virtual Status WaitForStream(const DeviceLane& where, void* framework_stream) = 0;
  // `framework_stream` waits for everything queued on the lane's stream now.
  virtual Status Release(const DeviceLane& where, void* framework_stream) = 0;
  // The host waits until the lane's stream has finished everything queued,
  // at most kDeviceWaitSeconds (an error after that): only when a failed
  // batch could not release the framework's streams, and for the probe.
  virtual Status Synchronize(const DeviceLane& where) = 0;
  // A buffer of at least `bytes` reused across calls (`slot` tells apart
  // buffers needed at the same time). Its contents are not kept when it grows.
  virtual Status Scratch(const DeviceLane& where, int slot, int64_t bytes, void** data) = 0;
  // dst = src * factor for every copy (a factor of 1 copies). Any number of
  // copies; one kernel launch serves up to kMaxCopiesPerLaunch of them.
  virtual Status CopyScaled(const DeviceLane& where, DataType dtype,
                            const std::vector<DeviceCopy>& copies, double factor) = 0;
  // dst = src / divisor * factor for every copy (integer division when
  // factor is 1; src may be dst): an average's division and postscale folded
  // into the copy out of a fused buffer, so they cost no pass of their own.
  virtual Status CopyFinalized(const DeviceLane& where, DataType dtype,
                               const std::vector<DeviceCopy>& copies, int divisor,
                               double factor) = 0;
  // Fills `count` elements with the neutral element of `op`.
  virtual Status FillNeutral(const DeviceLane& where, DataType dtype, ReduceOp op, void* data,
                             int64_t count) = 0;
  virtual Status Zero(const DeviceLane& where, void* data, int64_t bytes) = 0;
  // Frees the lane `lane`'s stream and scratch memory on every GPU, after
  // what they queued has finished: its engine (a removed process set) has
  // stopped and will not use them again.
  virtual void ReleaseLane(int lane) = 0;

  // Note [device time]
  // ~~~~~~~~~~~~~~~~~~
  // The host only queues GPU work, so the time the engine thread spends on
  // a GPU batch says nothing about how long the GPU took. To time the device
  // (the timeline's GPU spans, the autotuner's throughput), the engine puts
  // marks on the lane's stream around a batch and reads them a cycle or more
  // later, once the GPU has passed them. A mark's time is exact relative to
  // the lane's anchor, a mark recorded when the stream was idle (so reached
  // at once, at a known host time); the lane re-anchors whenever it finds
  // its stream idle, which keeps the float milliseconds CUDA measures precise.
  //
  // Engine thread: a mark on the lane's stream, reached when the stream has
  // done everything queued before it.
  virtual Status MarkTime(const DeviceLane& where, void** mark) = 0;
  // Whether the GPU has reached `mark` and, if so, the host-clock time it did.
  virtual Status MarkedTime(void* mark, bool* reached,
                            std::chrono::steady_clock::time_point* when) = 0;
  virtual void ReleaseMark(void* mark) = 0;
};

// A part of a buffer sent to or received from one rank.
struct DeviceSegment {
  int rank = 0;
  void* data = nullptr;
  int64_t bytes = 0;
};

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual std::string Describe() const = 0;
  // All queued on the device's engine stream, in the order called: every
  // rank must call them in the same order (the engine's agreed order does).
  // send == recv reduces in place. `op` is never Average (the engine sums
  // and divides itself).
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // Equal blocks (Note [reduce-scatter in equal blocks] in
  // collective_device_reduce.cc): `send` holds one block of `count`
  // elements per rank, in rank order; `recv` (this rank's block of `send`:
  // in place) gets block `rank` reduced over every rank's `send`.
  virtual Status ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                               ReduceOp op) = 0;
  // Equal blocks: every rank's `bytes` of `send` land in `recv` at
  // rank x `bytes`, on every rank; `send` may be this rank's block of
  // `recv` (in place).
  virtual Status Allgather(const void* send, void* recv, int64_t bytes) = 0;
  // Point-to-point bytes in one group: what allgather of uneven rows and
  // alltoall need.
  virtual Status Exchange(const std::vector<DeviceSegment>& sends,
                          const std::vector<DeviceSegment>& recvs) = 0;
  // An error the communicator met on its own since it started (a peer that
  // died, a network fault), without waiting: OK while it is healthy. The
  // engine asks every cycle; on an error it aborts the communicator, which
  // ends kernels still waiting on the lost peer.
  virtual Status AsyncError() = 0;
  // After a failure elsewhere, ends the communicator without waiting for
  // the other ranks.
  virtual void Abort() = 0;
};

// Registered by the device backend when it is compiled in.
struct DeviceBackend {
  const char* name = "";  // what `hvdkeras check` calls the build ("cuda")
  // The process's Device, made on first use; null with a reason when no GPU
  // is usable. Thread-safe.
  Device* (*device)(std::string* why_not) = nullptr;
  // Rank 0 makes a communicator id; every rank receives it (the engine
  // broadcasts it) and then makes its communicator, collectively.
  Status (*new_unique_id)(std::string* id) = nullptr;
  // The communicator queues its work on the stream of the lane `where`.
  // Neither making it nor any of its calls waits on the host for peers
  // longer than `wait_seconds` (0: no bound); past it they fail.
  Status (*make_communicator)(const std::string& id, int rank, int size, const DeviceLane& where,
                              double wait_seconds,
                              std::unique_ptr<DeviceCommunicator>* out) = nullptr;
  // What the backend was built with and which runtime libraries it finds,
  // as "name=value" lines, for `hvdkeras check`.
  std::string (*build_info)() = nullptr;
  // Where to look for the runtime libraries (colon-separated directories),
  // before the first use.
  void (*set_library_dirs)(const std::string& dirs) = nullptr;
  // Where compiled kernels are kept between runs ("" : not kept).
  void (*set_kernel_cache_dir)(const std::string& dir) = nullptr;
  // Compiles the GPU kernels for `arch` without running them (no GPU
  // needed), or reads them from the kernel cache: proves the run-time
  // compiler works here. Returns their size.
  Status (*compile_kernels)(const std::string& arch, int64_t* bytes) = nullptr;
  // Measures packing `tensors` buffers of `bytes_each` into a fused buffer
  // and back on GPU 0 (GB/s of data moved), against one plain
  // device-to-device copy of the same total each way, and a scaled float32
  // pack and unpack: results[0] packed, [1] plain, [2] scaled.
  Status (*probe_copies)(int tensors, int64_t bytes_each, int iterations,
                         double results[3]) = nullptr;
};

void RegisterDeviceBackend(const DeviceBackend& backend);

// Releases the ready events of a GPU op that will not run (it failed before
// its batch): see Device::Discard.
struct PendingOp;
void DiscardReadyEvents(PendingOp* op);
// Null when no backend was compiled in.
const DeviceBackend* GetDeviceBackend();
// The GPU this process was pinned to (hvdkeras.pin_gpu()), or -1: the GPU a
// rank uses when its batch holds only a joined rank's stand-ins.
void SetPinnedDevice(int device);
int PinnedDevice();
// The GPU a tensor of this process was last queued on (any process set),
// remembered for ranks pinned by their framework alone
// (tf.config.set_visible_devices, torch.cuda.set_device) without pin_gpu():
// such a rank uses one GPU, so the last is also the first.
void NoteDeviceUsed(int device);
// The GPU for a batch that names none (a joined rank's stand-ins only): the
// pinned one, else the one this process used, else 0.
int DefaultDevice();
// Note [process sets sharing a GPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each process set's engine makes its own communicator on its own lane
// (Note [device lanes]), and the sets' engines agree on their own orders,
// so two sets' NCCL kernels on one GPU are not ordered against each other,
// and they may be launched in different orders on different ranks. NCCL
// documents that as unsafe: where the two kernels cannot both be resident
// on the GPU, each rank's first kernel waits for a peer whose GPU runs the
// other one first. No order hvdkeras could impose would be the same on every
// rank, so it is the user's to keep (docs/gpus.md): a set's GPU collectives
// must not overlap another set's on the same GPU. The first time a second
// set makes a communicator on a GPU, rank 0 of that set says so once.
//
// Registers lane `lane`'s communicator on GPU `device` and returns the
// other lanes that have one there; RemoveCommunicatorLane undoes it.
std::vector<int> AddCommunicatorLane(int device, int lane);
void RemoveCommunicatorLane(int device, int lane);

// What is said when GPU work reaches a library without a backend.
inline constexpr char kNoGpuPart[] = "this op library was built without GPU support";

}  // namespace hvdkeras

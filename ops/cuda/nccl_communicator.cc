#include "cuda/nccl_communicator.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

namespace hvdkeras {
namespace cuda {

namespace {

Status NcclStatus(const Nccl& nccl, ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return Status::OK();
  return Status::Error(StatusCode::kPreconditionError,
                       std::string("hvdkeras NCCL: ") + what + " failed: " +
                           nccl.ncclGetErrorString(result));
}

bool NcclType(DataType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DataType::kUInt8: *out = ncclUint8; return true;
    case DataType::kInt8: *out = ncclInt8; return true;
    case DataType::kInt32: *out = ncclInt32; return true;
    case DataType::kUInt32: *out = ncclUint32; return true;
    case DataType::kInt64: *out = ncclInt64; return true;
    case DataType::kUInt64: *out = ncclUint64; return true;
    case DataType::kFloat16: *out = ncclFloat16; return true;
    case DataType::kBFloat16: *out = ncclBfloat16; return true;
    case DataType::kFloat32: *out = ncclFloat32; return true;
    case DataType::kFloat64: *out = ncclFloat64; return true;
    default: return false;
  }
}

// The engine never asks for Average (it sums, then divides on the device as
// the CPU path does: core/device_steps.h, WireOp).
ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    default: return ncclSum;
  }
}

std::string NcclVersionText(int code) {
  // Codes since NCCL 2.9 are major*10000 + minor*100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

using Clock = std::chrono::steady_clock;

Clock::time_point After(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Note [bounded NCCL calls]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Communicators are made non-blocking (ncclConfig_t.blocking = 0). A call
// that has to wait for its peers on the host (making the communicator,
// connecting two ranks at their first send and receive, ending a group)
// then answers ncclInProgress instead of blocking, and the communicator's
// state is polled until it settles, at most `wait_seconds`
// (DeviceWaitSeconds in core/device_session.h). A peer that failed before
// making the matching call, or that died, therefore costs this rank a
// bounded wait and an error, and the engine's agreement then fails every
// rank with the reason, instead of leaving ranks inside NCCL until the
// watchdog. Ending the communicator is bounded the same way: the stream
// must finish within the bound, or the communicator is aborted.
Status Settle(const Nccl& nccl, ncclComm_t comm, ncclResult_t result, const char* what,
              double wait_seconds) {
  if (result != ncclInProgress) return NcclStatus(nccl, result, what);
  const Clock::time_point deadline = After(wait_seconds);
  int polls = 0;
  while (true) {
    ncclResult_t state = ncclSuccess;
    Status s = NcclStatus(nccl, nccl.ncclCommGetAsyncError(comm, &state),
                          "asking the communicator for its state");
    if (!s.ok()) return s;
    if (state != ncclInProgress) return NcclStatus(nccl, state, what);
    if (wait_seconds > 0 && Clock::now() > deadline) {
      return Status::Error(StatusCode::kAborted,
                           std::string("hvdkeras NCCL: ") + what + " did not finish within " +
                               std::to_string(static_cast<int>(wait_seconds)) +
                               " s: a peer never made the matching call (it failed, or is "
                               "gone)");
    }
    if (++polls < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

class NcclCommunicator : public DeviceCommunicator {
 public:
  NcclCommunicator(const Nccl* nccl, const Runtime* rt, const DeviceLane& where,
                   cudaStream_t stream, ncclComm_t comm, double wait_seconds)
      : nccl_(nccl), rt_(rt), where_(where), stream_(stream), comm_(comm),
        wait_seconds_(wait_seconds) {}

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    // An orderly end, bounded (Note [bounded NCCL calls]): the queued work
    // finishes, then the communicator is finalized and destroyed. A stream
    // that does not finish (a peer skipped a call) or an error ends it with
    // an abort instead, which also frees the kernels still waiting.
    bool orderly = Finished();
    if (orderly) {
      orderly = Settle(*nccl_, comm_, nccl_->ncclCommFinalize(comm_), "finalizing the "
                       "communicator", wait_seconds_).ok();
    }
    if (orderly) {
      nccl_->ncclCommDestroy(comm_);
    } else {
      std::fprintf(stderr,
                   "hvdkeras: WARNING: the NCCL communicator's work did not finish within %d s "
                   "at shutdown; it was aborted\n",
                   static_cast<int>(wait_seconds_));
      nccl_->ncclCommAbort(comm_);
    }
  }

  std::string Describe() const override {
    int version = 0;
    nccl_->ncclGetVersion(&version);
    return "NCCL " + NcclVersionText(version);
  }

  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    ncclDataType_t type;
    if (!NcclType(dtype, &type)) return Unsupported(dtype);
    if (count == 0) return Status::OK();
    return Settled(nccl_->ncclAllReduce(send, recv, static_cast<size_t>(count), type,
                                        NcclOp(op), comm_, stream_),
                   "allreduce");
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    if (bytes == 0) return Status::OK();
    return Settled(nccl_->ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8,
                                        root, comm_, stream_),
                   "broadcast");
  }

  Status ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                       ReduceOp op) override {
    ncclDataType_t type;
    if (!NcclType(dtype, &type)) return Unsupported(dtype);
    if (count == 0) return Status::OK();
    return Settled(nccl_->ncclReduceScatter(send, recv, static_cast<size_t>(count), type,
                                            NcclOp(op), comm_, stream_),
                   "reduce-scatter");
  }

  Status Allgather(const void* send, void* recv, int64_t bytes) override {
    if (bytes == 0) return Status::OK();
    return Settled(nccl_->ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm_,
                                        stream_),
                   "allgather");
  }

  Status Exchange(const std::vector<DeviceSegment>& sends,
                  const std::vector<DeviceSegment>& recvs) override {
    if (sends.empty() && recvs.empty()) return Status::OK();
    Status s = Settled(nccl_->ncclGroupStart(), "starting a group");
    if (!s.ok()) return s;
    for (const DeviceSegment& seg : sends) {
      if (!s.ok()) break;
      s = Settled(nccl_->ncclSend(seg.data, static_cast<size_t>(seg.bytes), ncclUint8, seg.rank,
                                  comm_, stream_),
                  "send");
    }
    for (const DeviceSegment& seg : recvs) {
      if (!s.ok()) break;
      s = Settled(nccl_->ncclRecv(seg.data, static_cast<size_t>(seg.bytes), ncclUint8, seg.rank,
                                  comm_, stream_),
                  "receive");
    }
    // The group is always closed, even after a failed call inside it.
    // (Inside a group a non-blocking call answers ncclSuccess; the group's
    // end is where the peers are connected and waited for.)
    Status ended = Settled(nccl_->ncclGroupEnd(), "ending a group");
    return s.ok() ? ended : s;
  }

  Status AsyncError() override {
    if (comm_ == nullptr) return Status::OK();
    ncclResult_t error = ncclSuccess;
    Status s = NcclStatus(*nccl_, nccl_->ncclCommGetAsyncError(comm_, &error),
                          "asking the communicator for errors");
    if (s.ok() && error != ncclSuccess && error != ncclInProgress) {
      s = NcclStatus(*nccl_, error, "the communicator (a peer is gone or the network failed)");
    }
    return s;
  }

  void Abort() override {
    if (comm_ == nullptr) return;
    nccl_->ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  Status Settled(ncclResult_t result, const char* what) {
    return Settle(*nccl_, comm_, result, what, wait_seconds_);
  }

  // Whether the lane's stream finished its work within the bound, with no
  // error from the communicator meanwhile.
  bool Finished() {
    if (rt_ == nullptr) return false;
    const Clock::time_point deadline = After(wait_seconds_);
    while (true) {
      const cudaError_t e = rt_->cudaStreamQuery(stream_);
      if (e != cudaErrorNotReady) return e == cudaSuccess;
      if (!AsyncError().ok()) return false;
      if (wait_seconds_ > 0 && Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  Status Unsupported(DataType dtype) const {
    return Status::Error(StatusCode::kInvalidArgument,
                         std::string("NCCL cannot reduce ") + DataTypeName(dtype) +
                             " on the GPU; cast it to a type it reduces (int32, float32...)");
  }

  const Nccl* nccl_;
  const Runtime* rt_;
  DeviceLane where_;
  cudaStream_t stream_;
  ncclComm_t comm_;
  double wait_seconds_;
};

}  // namespace

Status NewNcclId(std::string* id) {
  std::string why;
  const Nccl* nccl = LoadNccl(&why);
  if (nccl == nullptr) {
    return Status::Error(StatusCode::kPreconditionError, "NCCL could not be loaded: " + why);
  }
  ncclUniqueId unique;
  Status s = NcclStatus(*nccl, nccl->ncclGetUniqueId(&unique), "making a communicator id");
  if (s.ok()) id->assign(unique.internal, sizeof(unique.internal));
  return s;
}

Status MakeNcclCommunicator(const std::string& id, int rank, int size, const DeviceLane& where,
                            double wait_seconds, std::unique_ptr<DeviceCommunicator>* out) {
  std::string why;
  const Nccl* nccl = LoadNccl(&why);
  CudaDevice* cuda = nccl ? CudaDevice::Get(&why) : nullptr;
  const Runtime* rt = cuda ? LoadRuntime(&why) : nullptr;
  if (nccl == nullptr || cuda == nullptr || rt == nullptr) {
    return Status::Error(StatusCode::kPreconditionError, "hvdkeras NCCL: " + why);
  }
  ncclUniqueId unique;
  if (id.size() != sizeof(unique.internal)) {
    return Status::Error(StatusCode::kInvalidArgument, "hvdkeras NCCL: malformed communicator id");
  }
  std::memcpy(unique.internal, id.data(), id.size());
  cudaStream_t stream = nullptr;
  Status s = cuda->EngineStream(where, &stream);  // also makes its GPU current
  if (!s.ok()) return s;
  // Non-blocking, so that a rank failing inside its own init cannot hold
  // the others in theirs: Note [bounded NCCL calls].
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  // The call writes `comm`; Settle reads it. Two statements: in one call's
  // argument list the order of the two is unspecified (g++ happened to make
  // the call first, clang reads a null communicator).
  const ncclResult_t started = nccl->ncclCommInitRankConfig(&comm, size, unique, rank, &config);
  s = Settle(*nccl, comm, started, "making the communicator", wait_seconds);
  if (!s.ok()) {
    s.message += " (NCCL allocates its buffers on the GPU here: a GPU out of memory fails "
                 "this way; NCCL_DEBUG=WARN says why)";
  }
  if (s.ok()) {
    out->reset(new NcclCommunicator(nccl, rt, where, stream, comm, wait_seconds));
  } else if (comm != nullptr) {
    nccl->ncclCommAbort(comm);
  }
  return s;
}

std::string DescribeNccl() {
  std::string why;
  const Nccl* nccl = LoadNccl(&why);
  const std::string built = "built with " + NcclVersionText(NCCL_VERSION_CODE);
  if (nccl == nullptr) return "not loadable (" + why + "); " + built;
  int version = 0;
  nccl->ncclGetVersion(&version);
  return NcclVersionText(version) + " (" + built + ")";
}

}  // namespace cuda
}  // namespace hvdkeras

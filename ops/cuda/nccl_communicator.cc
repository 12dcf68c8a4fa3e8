#include "cuda/nccl_communicator.h"

#include <cstring>

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

class NcclCommunicator : public DeviceCommunicator {
 public:
  NcclCommunicator(const Nccl* nccl, CudaDevice* device, const DeviceLane& where,
                   cudaStream_t stream, ncclComm_t comm)
      : nccl_(nccl), device_(device), where_(where), stream_(stream), comm_(comm) {}

  ~NcclCommunicator() override {
    if (comm_ == nullptr) return;
    // An orderly end: the queued work finishes before the communicator goes.
    device_->Synchronize(where_);
    nccl_->ncclCommDestroy(comm_);
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
    return NcclStatus(*nccl_,
                      nccl_->ncclAllReduce(send, recv, static_cast<size_t>(count), type,
                                           NcclOp(op), comm_, stream_),
                      "allreduce");
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    if (bytes == 0) return Status::OK();
    return NcclStatus(*nccl_,
                      nccl_->ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8,
                                           root, comm_, stream_),
                      "broadcast");
  }

  Status Exchange(const std::vector<DeviceSegment>& sends,
                  const std::vector<DeviceSegment>& recvs) override {
    if (sends.empty() && recvs.empty()) return Status::OK();
    Status s = NcclStatus(*nccl_, nccl_->ncclGroupStart(), "starting a group");
    if (!s.ok()) return s;
    for (const DeviceSegment& seg : sends) {
      if (!s.ok()) break;
      s = NcclStatus(*nccl_,
                     nccl_->ncclSend(seg.data, static_cast<size_t>(seg.bytes), ncclUint8,
                                     seg.rank, comm_, stream_),
                     "send");
    }
    for (const DeviceSegment& seg : recvs) {
      if (!s.ok()) break;
      s = NcclStatus(*nccl_,
                     nccl_->ncclRecv(seg.data, static_cast<size_t>(seg.bytes), ncclUint8,
                                     seg.rank, comm_, stream_),
                     "receive");
    }
    // The group is always closed, even after a failed call inside it.
    Status ended = NcclStatus(*nccl_, nccl_->ncclGroupEnd(), "ending a group");
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
  Status Unsupported(DataType dtype) const {
    return Status::Error(StatusCode::kInvalidArgument,
                         std::string("NCCL cannot reduce ") + DataTypeName(dtype) +
                             " on the GPU; cast it to a type it reduces (int32, float32...)");
  }

  const Nccl* nccl_;
  CudaDevice* device_;
  DeviceLane where_;
  cudaStream_t stream_;
  ncclComm_t comm_;
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
                            std::unique_ptr<DeviceCommunicator>* out) {
  std::string why;
  const Nccl* nccl = LoadNccl(&why);
  CudaDevice* cuda = nccl ? CudaDevice::Get(&why) : nullptr;
  if (nccl == nullptr || cuda == nullptr) {
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
  ncclComm_t comm = nullptr;
  s = NcclStatus(*nccl, nccl->ncclCommInitRank(&comm, size, unique, rank),
                 "making the communicator");
  if (s.ok()) out->reset(new NcclCommunicator(nccl, cuda, where, stream, comm));
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

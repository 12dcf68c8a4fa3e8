#include "core/mpi_context.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <cstdint>
#include <string>

#include "core/half.h"
#include "core/reduce_kernels.h"

namespace hvdkeras {

namespace {

// MPI counts are ints: large buffers are reduced in chunks of this many
// elements.
constexpr int64_t kMaxChunkElements = int64_t{1} << 28;

using Convert = float (*)(uint16_t);
using ConvertBack = uint16_t (*)(float);

template <Convert kLoad, ConvertBack kStore, typename Combine>
void Reduce16(void* in, void* inout, int* len, Combine combine) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = kStore(combine(kLoad(a[i]), kLoad(b[i])));
}

struct SumF { float operator()(float x, float y) const { return x + y; } };
struct MinF { float operator()(float x, float y) const { return std::min(x, y); } };
struct MaxF { float operator()(float x, float y) const { return std::max(x, y); } };
struct ProdF { float operator()(float x, float y) const { return x * y; } };

#define HVDKERAS_DEFINE_REDUCE16(NAME, LOAD, STORE, COMBINE)          \
  void NAME(void* in, void* inout, int* len, MPI_Datatype*) {        \
    Reduce16<LOAD, STORE>(in, inout, len, COMBINE());                \
  }

HVDKERAS_DEFINE_REDUCE16(HalfSum, HalfToFloat, FloatToHalf, SumF)
HVDKERAS_DEFINE_REDUCE16(HalfMin, HalfToFloat, FloatToHalf, MinF)
HVDKERAS_DEFINE_REDUCE16(HalfMax, HalfToFloat, FloatToHalf, MaxF)
HVDKERAS_DEFINE_REDUCE16(HalfProd, HalfToFloat, FloatToHalf, ProdF)
HVDKERAS_DEFINE_REDUCE16(BFloatSum, BFloat16ToFloat, FloatToBFloat16, SumF)
HVDKERAS_DEFINE_REDUCE16(BFloatMin, BFloat16ToFloat, FloatToBFloat16, MinF)
HVDKERAS_DEFINE_REDUCE16(BFloatMax, BFloat16ToFloat, FloatToBFloat16, MaxF)
HVDKERAS_DEFINE_REDUCE16(BFloatProd, BFloat16ToFloat, FloatToBFloat16, ProdF)
#undef HVDKERAS_DEFINE_REDUCE16

int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return 1;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kProduct: return 3;
    default: return 0;  // Sum and Average both sum
  }
}

Status MpiError(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Status::Error(StatusCode::kUnknown,
                       std::string(call) + " failed: " + std::string(text, len));
}

}  // namespace

Status MpiContext::Open(MPI_Comm comm) {
  comm_ = comm;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Errors come back as codes so a failed call fails the op, not the process.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_User_function* fns[2][4] = {{HalfSum, HalfMin, HalfMax, HalfProd},
                                  {BFloatSum, BFloatMin, BFloatMax, BFloatProd}};
  for (int t = 0; t < 2; ++t) {
    for (int o = 0; o < 4; ++o) MPI_Op_create(fns[t][o], 1, &half_ops_[t][o]);
  }
  ops_created_ = true;
  return Status::OK();
}

void MpiContext::Close() {
  if (ops_created_) {
    for (auto& row : half_ops_) {
      for (MPI_Op& op : row) MPI_Op_free(&op);
    }
    ops_created_ = false;
  }
  comm_ = MPI_COMM_NULL;
}

MPI_Datatype MpiContext::MpiType(DataType dtype) const {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUInt32: return MPI_UINT32_T;
    case DataType::kUInt64: return MPI_UINT64_T;
  }
  return MPI_BYTE;
}

MPI_Op MpiContext::MpiOp(DataType dtype, ReduceOp op) const {
  if (dtype == DataType::kFloat16) return half_ops_[0][OpIndex(op)];
  if (dtype == DataType::kBFloat16) return half_ops_[1][OpIndex(op)];
  switch (op) {
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
}

void MpiContext::UseRing(const RingCollectives* ring, int hosts, RingSetting setting,
                         int64_t min_bytes) {
  ring_ = ring != nullptr && ring->active() ? ring : nullptr;
  ring_hosts_ = hosts;
  ring_setting_ = setting;
  ring_min_bytes_ = min_bytes;
}

bool MpiContext::RingTakes(int64_t bytes, DataType dtype) const {
  return ring_ != nullptr && CanReduce(dtype) &&
         RingWins(ring_setting_, ring_hosts_, size_, bytes, ring_min_bytes_);
}

Status MpiContext::Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dtype,
                             ReduceOp op, const RingStages* stages) const {
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(dtype));
  if (RingTakes(bytes, dtype)) {
    return ring_->Allreduce(sendbuf ? sendbuf : recvbuf, recvbuf, count, dtype, op, stages);
  }
  if (stages && stages->before_read) stages->before_read(0, bytes);
  Status s = MpiAllreduce(sendbuf, recvbuf, count, dtype, op);
  if (s.ok() && stages && stages->on_final) stages->on_final(0, bytes);
  return s;
}

Status MpiContext::MpiAllreduce(const void* sendbuf, void* recvbuf, int64_t count,
                                DataType dtype, ReduceOp op) const {
  const MPI_Datatype type = MpiType(dtype);
  const MPI_Op mpi_op = MpiOp(dtype, op);
  const size_t element = DataTypeSize(dtype);
  // Chunks of a few hundred KiB to a few MiB stay in cache while MPI moves
  // them: measured 3-4x faster than one call for 64 MiB on two ranks.
  const int64_t chunk =
      allreduce_chunk_bytes_ > 0
          ? std::clamp<int64_t>(allreduce_chunk_bytes_ / static_cast<int64_t>(element), 1,
                                kMaxChunkElements)
          : kMaxChunkElements;
  for (int64_t offset = 0; offset < count; offset += chunk) {
    const int n = static_cast<int>(std::min(chunk, count - offset));
    char* out = static_cast<char*>(recvbuf) + offset * element;
    if (sendbuf && sendbuf != recvbuf) {
      std::memcpy(out, static_cast<const char*>(sendbuf) + offset * element, n * element);
    }
    int rc = MPI_Allreduce(MPI_IN_PLACE, out, n, type, mpi_op, comm_);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Allreduce", rc);
  }
  return Status::OK();
}

Status MpiContext::Broadcast(void* buffer, int64_t bytes, int root) const {
  for (int64_t offset = 0; offset < bytes; offset += kMaxChunkElements) {
    const int n = static_cast<int>(std::min(kMaxChunkElements, bytes - offset));
    int rc = MPI_Bcast(static_cast<char*>(buffer) + offset, n, MPI_BYTE, root, comm_);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Bcast", rc);
  }
  return Status::OK();
}

namespace {

#if MPI_VERSION >= 4
constexpr bool kLargeCounts = true;
#else
constexpr bool kLargeCounts = false;
#endif

bool FitsInt(const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    if (v > INT32_MAX) return false;
  }
  return true;
}

std::vector<int> ToInts(const std::vector<int64_t>& values) {
  return std::vector<int>(values.begin(), values.end());
}

Status TooLarge(const char* what) {
  return Status::Error(StatusCode::kInvalidArgument,
                       std::string(what) + " exceeds 2 GiB per rank, which this MPI (no MPI-4 "
                       "large-count support) cannot move in one call");
}

}  // namespace

Status MpiContext::Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                              const std::vector<int64_t>& recv_bytes,
                              const std::vector<int64_t>& displs) const {
  int64_t total = 0;
  bool end_to_end = ring_ != nullptr;  // the ring lays blocks back to back
  for (size_t r = 0; end_to_end && r < recv_bytes.size(); ++r) {
    end_to_end = displs[r] == total;
    total += recv_bytes[r];
  }
  if (end_to_end && RingTakes(total, DataType::kUInt8)) {
    char* mine = static_cast<char*>(recvbuf) + displs[rank_];
    if (sendbuf != mine) std::memcpy(mine, sendbuf, static_cast<size_t>(send_bytes));
    return ring_->Allgather(recvbuf, recv_bytes);
  }
  int rc = MPI_SUCCESS;
  if (FitsInt(recv_bytes) && FitsInt(displs) && send_bytes <= INT32_MAX) {
    const std::vector<int> counts = ToInts(recv_bytes), offsets = ToInts(displs);
    rc = MPI_Allgatherv(sendbuf, static_cast<int>(send_bytes), MPI_BYTE, recvbuf, counts.data(),
                        offsets.data(), MPI_BYTE, comm_);
  } else if (kLargeCounts) {
#if MPI_VERSION >= 4
    const std::vector<MPI_Count> counts(recv_bytes.begin(), recv_bytes.end());
    const std::vector<MPI_Aint> offsets(displs.begin(), displs.end());
    rc = MPI_Allgatherv_c(sendbuf, send_bytes, MPI_BYTE, recvbuf, counts.data(), offsets.data(),
                          MPI_BYTE, comm_);
#endif
  } else {
    return TooLarge("allgather");
  }
  return rc == MPI_SUCCESS ? Status::OK() : MpiError("MPI_Allgatherv", rc);
}

Status MpiContext::Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes,
                             const std::vector<int64_t>& send_displs, void* recvbuf,
                             const std::vector<int64_t>& recv_bytes,
                             const std::vector<int64_t>& recv_displs) const {
  int rc = MPI_SUCCESS;
  if (FitsInt(send_bytes) && FitsInt(send_displs) && FitsInt(recv_bytes) &&
      FitsInt(recv_displs)) {
    const std::vector<int> sc = ToInts(send_bytes), sd = ToInts(send_displs),
                           rcnt = ToInts(recv_bytes), rd = ToInts(recv_displs);
    rc = MPI_Alltoallv(sendbuf, sc.data(), sd.data(), MPI_BYTE, recvbuf, rcnt.data(), rd.data(),
                       MPI_BYTE, comm_);
  } else if (kLargeCounts) {
#if MPI_VERSION >= 4
    const std::vector<MPI_Count> sc(send_bytes.begin(), send_bytes.end()),
        rcnt(recv_bytes.begin(), recv_bytes.end());
    const std::vector<MPI_Aint> sd(send_displs.begin(), send_displs.end()),
        rd(recv_displs.begin(), recv_displs.end());
    rc = MPI_Alltoallv_c(sendbuf, sc.data(), sd.data(), MPI_BYTE, recvbuf, rcnt.data(),
                         rd.data(), MPI_BYTE, comm_);
#endif
  } else {
    return TooLarge("alltoall");
  }
  return rc == MPI_SUCCESS ? Status::OK() : MpiError("MPI_Alltoallv", rc);
}

Status MpiContext::ReduceScatter(void* sendbuf, void* recvbuf,
                                 const std::vector<int64_t>& recv_counts, DataType dtype,
                                 ReduceOp op) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  int64_t total = 0, mine = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) mine = total;
    total += recv_counts[r];
  }
  if (RingTakes(total * element, dtype)) {
    Status s = ring_->ReduceScatter(sendbuf, recv_counts, dtype, op);
    if (s.ok()) {
      std::memcpy(recvbuf, static_cast<char*>(sendbuf) + mine * element,
                  static_cast<size_t>(recv_counts[rank_] * element));
    }
    return s;
  }
  int rc = MPI_SUCCESS;
  if (FitsInt(recv_counts)) {
    const std::vector<int> counts = ToInts(recv_counts);
    rc = MPI_Reduce_scatter(sendbuf, recvbuf, counts.data(), MpiType(dtype), MpiOp(dtype, op),
                            comm_);
  } else if (kLargeCounts) {
#if MPI_VERSION >= 4
    const std::vector<MPI_Count> counts(recv_counts.begin(), recv_counts.end());
    rc = MPI_Reduce_scatter_c(sendbuf, recvbuf, counts.data(), MpiType(dtype), MpiOp(dtype, op),
                              comm_);
#endif
  } else {
    return TooLarge("reducescatter");
  }
  return rc == MPI_SUCCESS ? Status::OK() : MpiError("MPI_Reduce_scatter", rc);
}

Status MpiContext::Barrier() const {
  int rc = MPI_Barrier(comm_);
  return rc == MPI_SUCCESS ? Status::OK() : MpiError("MPI_Barrier", rc);
}

}  // namespace hvdkeras

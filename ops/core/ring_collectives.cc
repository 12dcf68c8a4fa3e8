#include "core/ring_collectives.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "core/reduce_kernels.h"

namespace hvdkeras {

namespace {

// Receives posted ahead of the one being waited for: enough to keep the
// link busy while a segment is added, few enough to bound the landing
// memory (kWindow segments).
constexpr int64_t kWindow = 8;
constexpr int kTag = 0;

Status RingError(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Status::Error(StatusCode::kUnknown, std::string("ring ") + call + " failed: " +
                                                 std::string(text, len));
}

std::vector<int64_t> BlockBytes(const std::vector<int64_t>& counts, int64_t element) {
  std::vector<int64_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * element;
  return bytes;
}

}  // namespace

Status RingCollectives::Open(MPI_Comm comm) {
  Close(false);
  if (MPI_Comm_dup(comm, &comm_) != MPI_SUCCESS) {
    comm_ = MPI_COMM_NULL;
    return Status::Error(StatusCode::kUnknown, "MPI_Comm_dup for the ring failed");
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  return Status::OK();
}

void RingCollectives::Close(bool collective) {
  if (comm_ != MPI_COMM_NULL && collective) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
  slots_.clear();
  slots_.shrink_to_fit();
}

Status RingCollectives::Allreduce(void* buffer, int64_t count, DataType dtype,
                                  ReduceOp op) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    counts[r] = count * (r + 1) / size_ - count * r / size_;
  }
  return Run(RingKind::kAllreduce, static_cast<char*>(buffer), BlockBytes(counts, element), dtype,
             op);
}

Status RingCollectives::ReduceScatter(void* work, const std::vector<int64_t>& counts,
                                      DataType dtype, ReduceOp op) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  return Run(RingKind::kReduceScatter, static_cast<char*>(work), BlockBytes(counts, element),
             dtype, op);
}

Status RingCollectives::Allgather(void* buffer, const std::vector<int64_t>& bytes) const {
  return Run(RingKind::kAllgather, static_cast<char*>(buffer), bytes, DataType::kUInt8,
             ReduceOp::kSum);
}

Status RingCollectives::Run(RingKind kind, char* work, const std::vector<int64_t>& block_bytes,
                            DataType dtype, ReduceOp op) const {
  if (size_ < 2) return Status::OK();
  int64_t total = 0;
  for (int64_t b : block_bytes) total += b;
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const RingSchedule plan =
      PlanRing(kind, rank_, size_, block_bytes, element, RingSegmentBytes(total, size_));
  const int left = (rank_ + size_ - 1) % size_;
  const int right = (rank_ + 1) % size_;
  const int64_t recvs = static_cast<int64_t>(plan.recvs.size());
  const int64_t sends = static_cast<int64_t>(plan.sends.size());
  int64_t slot_bytes = 0;
  for (const RingSegment& s : plan.recvs) {
    if (s.reduce) slot_bytes = std::max(slot_bytes, s.bytes);
  }
  if (static_cast<int64_t>(slots_.size()) < kWindow * slot_bytes) {
    slots_.resize(static_cast<size_t>(kWindow * slot_bytes));
  }
  std::vector<MPI_Request> recv_req(recvs, MPI_REQUEST_NULL);
  std::vector<MPI_Request> send_req(sends, MPI_REQUEST_NULL);
  // A segment written over by the allgather half may still be going out
  // from the reduce-scatter half: its send is waited for first. That send
  // is earlier in every neighbour's order than the receive being posted,
  // so the wait always ends (Note [ring across hosts]).
  std::unordered_map<int64_t, int64_t> sent_from;  // offset -> send index
  auto landing = [&](int64_t i) {
    const RingSegment& s = plan.recvs[i];
    return s.reduce ? slots_.data() + (i % kWindow) * slot_bytes : work + s.offset;
  };
  auto post_recv = [&](int64_t i) -> Status {
    const RingSegment& s = plan.recvs[i];
    if (!s.reduce) {
      auto it = sent_from.find(s.offset);
      if (it != sent_from.end()) {
        int rc = MPI_Wait(&send_req[it->second], MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return RingError("MPI_Wait (send)", rc);
        sent_from.erase(it);
      }
    }
    int rc = MPI_Irecv(landing(i), static_cast<int>(s.bytes), MPI_BYTE, left, kTag, comm_,
                       &recv_req[i]);
    return rc == MPI_SUCCESS ? Status::OK() : RingError("MPI_Irecv", rc);
  };
  auto post_send = [&](int64_t i) -> Status {
    const RingSegment& s = plan.sends[i];
    if (kind == RingKind::kAllreduce) sent_from[s.offset] = i;
    int rc = MPI_Isend(work + s.offset, static_cast<int>(s.bytes), MPI_BYTE, right, kTag, comm_,
                       &send_req[i]);
    return rc == MPI_SUCCESS ? Status::OK() : RingError("MPI_Isend", rc);
  };

  Status s;
  for (int64_t i = 0; i < std::min(kWindow, recvs) && s.ok(); ++i) s = post_recv(i);
  for (int64_t i = 0; i < plan.ready_sends && s.ok(); ++i) s = post_send(i);
  for (int64_t i = 0; i < recvs && s.ok(); ++i) {
    int rc = MPI_Wait(&recv_req[i], MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return RingError("MPI_Wait (receive)", rc);
    const RingSegment& seg = plan.recvs[i];
    if (seg.reduce &&
        !ReduceInto(dtype, op, work + seg.offset, landing(i), seg.bytes / element)) {
      return Status::Error(StatusCode::kInvalidArgument, "ring reduction of an unreducible dtype");
    }
    if (i + plan.ready_sends < sends) s = post_send(i + plan.ready_sends);
    if (s.ok() && i + kWindow < recvs) s = post_recv(i + kWindow);
  }
  if (!s.ok()) return s;
  int rc = MPI_Waitall(static_cast<int>(sends), send_req.data(), MPI_STATUSES_IGNORE);
  return rc == MPI_SUCCESS ? Status::OK() : RingError("MPI_Waitall (sends)", rc);
}

}  // namespace hvdkeras

#include "core/ring_collectives.h"

#include <algorithm>
#include <cstring>
#include <chrono>
#include <thread>
#include <string>
#include <unordered_map>

#include "core/reduce_kernels.h"

namespace hvdkeras {

namespace {

// Receives (and sends) in flight at once: enough to keep the link busy
// while a segment is added, few enough to bound the landing memory
// (kWindow segments) and to keep the segment a neighbour needs next from
// sharing the link with many others (measured on the lab: 2, 8 or no
// bound on sends made no difference there).
constexpr int64_t kWindow = 8;
constexpr int kTag = 0;

// Note [waiting for the ring]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MPI_Wait spins. With MPI over TCP the bytes move in the kernel, which
// needs a core too, and in a training step the framework computes beside
// the engine: a rank spinning in MPI takes that core. So the ring tests its
// requests and, once nothing has moved for a few rounds, sleeps a few tens
// of microseconds between tests: at 10 Gbit/s that is tens of KB, which
// the socket buffers hold.
void Idle(int rounds) {
  if (rounds < 16) return;
  if (rounds < 64) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(20));
}

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

Status RingCollectives::Allreduce(const void* input, void* output, int64_t count, DataType dtype,
                                  ReduceOp op, const RingStages* stages) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<int64_t> counts(size_);
  for (int r = 0; r < size_; ++r) {
    counts[r] = count * (r + 1) / size_ - count * r / size_;
  }
  return Run(RingKind::kAllreduce, static_cast<const char*>(input), static_cast<char*>(output),
             BlockBytes(counts, element), dtype, op, stages);
}

Status RingCollectives::ReduceScatter(void* work, const std::vector<int64_t>& counts,
                                      DataType dtype, ReduceOp op) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  return Run(RingKind::kReduceScatter, static_cast<const char*>(work), static_cast<char*>(work),
             BlockBytes(counts, element), dtype, op);
}

Status RingCollectives::Allgather(void* buffer, const std::vector<int64_t>& bytes) const {
  return Run(RingKind::kAllgather, static_cast<const char*>(buffer), static_cast<char*>(buffer),
             bytes, DataType::kUInt8, ReduceOp::kSum);
}

// Note [fused work in the ring]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A fused allreduce used to copy every tensor into the fusion buffer, run
// the ring, then scale the whole result: two passes over tens of MB during
// which the link idles (at 1 Gbit/s, 60 MB of ResNet-50's gradients spent
// ~20 ms in them). With `RingStages` the ring does that work segment by
// segment as the chain reaches it: each byte of the input is read exactly
// once in the reduce-scatter half (sent as this rank's own data, or added to
// a received segment), so `before_read` fills it just before; and each
// element of this rank's own block gets its final sum exactly once, at the
// last reduce-scatter step, so `on_final` scales it there, before the
// allgather half sends it on: the other ranks receive finished values.
// The copy and the scaling then overlap the segments in flight.
Status RingCollectives::Run(RingKind kind, const char* input, char* work,
                            const std::vector<int64_t>& block_bytes, DataType dtype,
                            ReduceOp op, const RingStages* stages) const {
  int64_t total = 0;
  for (int64_t b : block_bytes) total += b;
  const bool read_hook = stages && stages->before_read;
  const bool final_hook = stages && stages->on_final && kind == RingKind::kAllreduce;
  if (size_ < 2) {
    if (read_hook) stages->before_read(0, total);
    if (input != work) std::memcpy(work, input, static_cast<size_t>(total));
    if (final_hook) stages->on_final(0, total);
    return Status::OK();
  }
  int64_t own_begin = 0;
  for (int r = 0; r < rank_; ++r) own_begin += block_bytes[r];
  const int64_t own_end = own_begin + block_bytes[rank_];
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
  // Where the reduce-scatter half sent each segment from: the allgather half
  // writes over it only once that send is done.
  std::unordered_map<int64_t, int64_t> sent_from;  // offset -> send index
  auto landing = [&](int64_t i) {
    const RingSegment& s = plan.recvs[i];
    return s.reduce ? slots_.data() + (i % kWindow) * slot_bytes : work + s.offset;
  };
  // One loop that never blocks in MPI: it posts what may go, completes
  // receives and sends in order, and sleeps briefly when nothing moved (Note
  // [waiting for the ring]). Receives and sends are both windowed, so
  // nothing is waited for that a neighbour cannot deliver.
  int64_t recv_posted = 0, recv_done = 0, send_posted = 0, send_done = 0;
  int idle = 0;
  while (recv_done < recvs || send_done < sends) {
    while (recv_posted < recvs && recv_posted < recv_done + kWindow) {
      const RingSegment& s = plan.recvs[recv_posted];
      if (!s.reduce) {
        auto it = sent_from.find(s.offset);
        if (it != sent_from.end() && it->second >= send_done) break;
      }
      int rc = MPI_Irecv(landing(recv_posted), static_cast<int>(s.bytes), MPI_BYTE, left, kTag,
                         comm_, &recv_req[recv_posted]);
      if (rc != MPI_SUCCESS) return RingError("MPI_Irecv", rc);
      ++recv_posted;
    }
    // Eager sends complete at once (Note [eager ring segments]), so the send
    // window alone would not hold a rank back: it also stays within a window
    // of its own receives, which pace its right neighbour's, so its segments
    // meet posted receives instead of piling up unmatched at the neighbour.
    while (send_posted < sends && send_posted < recv_done + plan.ready_sends &&
           send_posted < send_done + kWindow && send_posted < recv_done + kWindow) {
      const RingSegment& s = plan.sends[send_posted];
      if (kind == RingKind::kAllreduce) sent_from[s.offset] = send_posted;
      // This rank's own data goes out from the input; the rest are segments
      // received (and added) into the output.
      const bool own = send_posted < plan.ready_sends;
      if (own && read_hook) stages->before_read(s.offset, s.offset + s.bytes);
      const char* from = (own ? input : work) + s.offset;
      int rc = MPI_Isend(from, static_cast<int>(s.bytes), MPI_BYTE, right, kTag, comm_,
                         &send_req[send_posted]);
      if (rc != MPI_SUCCESS) return RingError("MPI_Isend", rc);
      ++send_posted;
    }
    bool moved = false;
    int done = 0;
    while (recv_done < recv_posted) {
      int rc = MPI_Test(&recv_req[recv_done], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return RingError("MPI_Test (receive)", rc);
      if (!done) break;
      const RingSegment& seg = plan.recvs[recv_done];
      // Every output element is written once: added to the input's here, or
      // copied in by the allgather half.
      if (seg.reduce && read_hook) stages->before_read(seg.offset, seg.offset + seg.bytes);
      if (seg.reduce && !Reduce(dtype, op, work + seg.offset, input + seg.offset,
                                landing(recv_done), seg.bytes / element)) {
        return Status::Error(StatusCode::kInvalidArgument,
                             "ring reduction of an unreducible dtype");
      }
      if (seg.reduce && final_hook && seg.offset >= own_begin && seg.offset < own_end) {
        stages->on_final(seg.offset, seg.offset + seg.bytes);
      }
      ++recv_done;
      moved = true;
    }
    while (send_done < send_posted) {
      int rc = MPI_Test(&send_req[send_done], &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return RingError("MPI_Test (send)", rc);
      if (!done) break;
      ++send_done;
      moved = true;
    }
    if (moved) {
      idle = 0;
    } else {
      Idle(++idle);
    }
  }
  return Status::OK();
}

}  // namespace hvdkeras

#include "core/shm_allreduce.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/block_pool.h"
#include "core/reduce_kernels.h"
#include "core/scaling.h"

namespace hvdkeras {

namespace {

// The barrier counter and the posted block offset sit in their own cache
// line ahead of the staging area.
constexpr int64_t kControlBytes = 64;
constexpr int64_t kPostedAt = 8;

}  // namespace

Status ShmAllreduce::Open(MPI_Comm host, const MpiContext* cross, int slices,
                          int64_t chunk_bytes, int64_t arena_bytes) {
  Close(false);
  comm_ = host;
  cross_ = cross;
  arena_bytes_ = arena_bytes;
  arena_tried_ = false;
  MPI_Comm_rank(host, &rank_);
  MPI_Comm_size(host, &size_);
  slices_ = std::clamp(slices, 1, size_);
  if (size_ < 2 && cross == nullptr) return Status::OK();
  const int64_t piece_bytes = chunk_bytes > 0 ? chunk_bytes : int64_t{4} << 20;
  piece_bytes_ = std::max<int64_t>(piece_bytes, int64_t{64} << 10) / 64 * 64;
  char* base = nullptr;
  const MPI_Aint bytes = static_cast<MPI_Aint>(kControlBytes + 2 * piece_bytes_);
  int ok = MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, host, &base, &win_) == MPI_SUCCESS;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, host);
  if (!ok) {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    win_ = MPI_WIN_NULL;
    return Status::OK();
  }
  scratch_.assign(static_cast<size_t>(piece_bytes_ / slices_ + kControlBytes), 0);
  staging_.assign(size_, nullptr);
  arrivals_.assign(size_, nullptr);
  posted_.assign(size_, nullptr);
  for (int r = 0; r < size_; ++r) {
    MPI_Aint size = 0;
    int disp = 0;
    char* peer = nullptr;
    MPI_Win_shared_query(win_, r, &size, &disp, &peer);
    arrivals_[r] = reinterpret_cast<uint64_t*>(peer);
    posted_[r] = reinterpret_cast<int64_t*>(peer + kPostedAt);
    staging_[r] = peer + kControlBytes;
  }
  __atomic_store_n(arrivals_[rank_], uint64_t{0}, __ATOMIC_RELEASE);
  epoch_ = 0;
  pieces_done_ = 0;
  MPI_Barrier(host);  // every counter is zero before anyone uses one
  active_ = true;
  return Status::OK();
}

void ShmAllreduce::Close(bool collective) {
  if (win_ != MPI_WIN_NULL && collective) MPI_Win_free(&win_);
  win_ = MPI_WIN_NULL;
  active_ = false;
  arena_.Close();
  staging_.clear();
  arrivals_.clear();
  posted_.clear();
}

void ShmAllreduce::Barrier() {
  ++epoch_;
  __atomic_store_n(arrivals_[rank_], epoch_, __ATOMIC_RELEASE);
  for (int r = 0; r < size_; ++r) {
    int spins = 0;
    while (__atomic_load_n(arrivals_[r], __ATOMIC_ACQUIRE) < epoch_) {
      // Usually the others are a few microseconds away; past that, let the
      // core go to whoever the late rank is waiting on.
      if (++spins > 2000) std::this_thread::yield();
    }
  }
}

void ShmAllreduce::SliceOf(int slice, int64_t n, int64_t* begin, int64_t* end) const {
  if (slice >= slices_) {
    *begin = *end = n;  // no slice: this rank only contributes and reads
    return;
  }
  *begin = n * slice / slices_;
  *end = n * (slice + 1) / slices_;
}

Status ShmAllreduce::ReduceSlice(const std::vector<char*>& inputs, int64_t at, int64_t len,
                                 char* dst, DataType dtype, ReduceOp op, int divisor,
                                 double postscale) const {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  if (size_ == 1) std::memcpy(dst, inputs[0] + at, static_cast<size_t>(len * element));
  // The first two ranks' contributions are combined in one pass.
  for (int r = 1; r < size_; ++r) {
    const void* acc = r == 1 ? static_cast<const void*>(inputs[0] + at) : dst;
    if (!Reduce(dtype, op, dst, acc, inputs[r] + at, len)) {
      return Status::Error(StatusCode::kInvalidArgument, "allreduce of an unreducible dtype");
    }
  }
  if (cross_) {
    Status s = cross_->Allreduce(nullptr, dst, len, dtype, op);
    if (!s.ok()) return s;
  }
  if (divisor != 1 || postscale != 1.0) FinalizeCopy(dtype, dst, dst, len, divisor, postscale);
  return Status::OK();
}

Status ShmAllreduce::Run(char* out, int64_t count, DataType dtype, ReduceOp op, int divisor,
                         double postscale, const Fill& fill) {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  std::vector<char*> halves(size_);
  for (int64_t offset = 0; offset < count; offset += piece) {
    const int64_t n = std::min(piece, count - offset);
    const int64_t half = (pieces_done_++ % 2) * piece_bytes_;
    fill(offset, offset + n, staging_[rank_] + half);
    Barrier();
    // My slice, combined from every rank's staging (and across hosts), then
    // published in my staging for the others.
    int64_t begin = 0, end = 0;
    SliceOf(rank_, n, &begin, &end);
    for (int r = 0; r < size_; ++r) halves[r] = staging_[r] + half;
    char* mine = out + (offset + begin) * element;
    Status s = ReduceSlice(halves, begin * element, end - begin, mine, dtype, op, divisor,
                           postscale);
    if (!s.ok()) return s;
    std::memcpy(staging_[rank_] + half + begin * element, mine, (end - begin) * element);
    Barrier();
    for (int r = 0; r < slices_; ++r) {
      if (r == rank_) continue;
      int64_t b = 0, e = 0;
      SliceOf(r, n, &b, &e);
      std::memcpy(out + (offset + b) * element, staging_[r] + half + b * element, (e - b) * element);
    }
  }
  return Status::OK();
}

Status ShmAllreduce::RunShared(int64_t count, DataType dtype, ReduceOp op, int divisor,
                               double postscale, const Fill& fill, bool wanted,
                               std::shared_ptr<char>* block) {
  block->reset();
  if (!arena_.active()) {
    if (arena_tried_) return Status::OK();
    // Every rank gets here in the same op, so the arena is made (or, with
    // some rank's size 0, refused) together.
    arena_tried_ = true;
    arena_.Open(comm_, arena_bytes_);
    if (!arena_.active()) return Status::OK();
  }
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  int64_t offset = -1;
  std::shared_ptr<char> mine;
  if (wanted) mine = arena_.Acquire(AlignUp(count * element), &offset);
  __atomic_store_n(posted_[rank_], offset, __ATOMIC_RELAXED);  // published by the barrier
  Barrier();
  std::vector<char*> blocks(size_);
  for (int r = 0; r < size_; ++r) {
    const int64_t at = __atomic_load_n(posted_[r], __ATOMIC_RELAXED);
    if (at < 0) return Status::OK();  // some rank is full: all take the staging way
    blocks[r] = arena_.Region(r) + at;
  }
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  for (int64_t first = 0; first < count; first += piece) {
    const int64_t n = std::min(piece, count - first);
    fill(first, first + n, blocks[rank_] + first * element);
    Barrier();
    // My slice of the piece, combined as Run does. Not in place in my
    // block: that is one of the inputs, still needed after the first step
    // when there are more than two ranks.
    int64_t begin = 0, end = 0;
    SliceOf(rank_, n, &begin, &end);
    const int64_t at = (first + begin) * element;
    const int64_t len = end - begin;
    char* slice = scratch_.data();
    Status s = ReduceSlice(blocks, at, len, slice, dtype, op, divisor, postscale);
    if (!s.ok()) return s;
    for (int r = 0; r < size_; ++r) {
      std::memcpy(blocks[r] + at, slice, static_cast<size_t>(len * element));
    }
  }
  Barrier();  // every slice is in every block
  *block = std::move(mine);
  return Status::OK();
}

Status ShmAllreduce::ReduceScatter(const std::vector<int64_t>& counts, char* out,
                                   DataType dtype, ReduceOp op, int divisor, double postscale,
                                   const Fill& fill) {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  std::vector<int64_t> starts(size_, 0);
  int64_t longest = 0;
  for (int r = 0; r < size_; ++r) {
    starts[r] = r == 0 ? 0 : starts[r - 1] + counts[r - 1];
    longest = std::max(longest, counts[r]);
  }
  // Each piece: up to `part` elements of every rank's block, rank r's part
  // at r * part in the staging half.
  const int64_t part = std::max<int64_t>(1, piece_bytes_ / element / size_);
  std::vector<char*> halves(size_);
  for (int64_t offset = 0; offset < longest; offset += part) {
    const int64_t half = (pieces_done_++ % 2) * piece_bytes_;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = std::clamp<int64_t>(counts[r] - offset, 0, part);
      if (n > 0) {
        fill(starts[r] + offset, starts[r] + offset + n,
             staging_[rank_] + half + r * part * element);
      }
    }
    // One barrier per piece is enough: a rank refills this half two pieces
    // later, after the next piece's barrier, which every rank reaches only
    // once it has read this one.
    Barrier();
    for (int r = 0; r < size_; ++r) halves[r] = staging_[r] + half;
    const int64_t n = std::clamp<int64_t>(counts[rank_] - offset, 0, part);
    if (n == 0) continue;
    Status s = ReduceSlice(halves, rank_ * part * element, n, out + offset * element, dtype, op,
                           divisor, postscale);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace hvdkeras

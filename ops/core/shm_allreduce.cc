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

Status ShmAllreduce::Open(MPI_Comm comm, int64_t chunk_bytes, int64_t arena_bytes) {
  Close(false);
  comm_ = comm;
  arena_bytes_ = arena_bytes;
  arena_tried_ = false;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
  if (size_ < 2) return Status::OK();
  MPI_Comm local = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local) !=
      MPI_SUCCESS) {
    return Status::OK();
  }
  int local_size = 0;
  MPI_Comm_size(local, &local_size);
  int one_host = local_size == size_ ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &one_host, 1, MPI_INT, MPI_MIN, comm);
  MPI_Comm_free(&local);
  if (!one_host) return Status::OK();

  const int64_t piece_bytes = chunk_bytes > 0 ? chunk_bytes : int64_t{4} << 20;
  piece_bytes_ = std::max<int64_t>(piece_bytes, int64_t{64} << 10) / 64 * 64;
  char* base = nullptr;
  const MPI_Aint bytes = static_cast<MPI_Aint>(kControlBytes + 2 * piece_bytes_);
  int ok = MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, comm, &base, &win_) == MPI_SUCCESS;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok) {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    win_ = MPI_WIN_NULL;
    return Status::OK();
  }
  scratch_.assign(static_cast<size_t>(piece_bytes_ / size_ + kControlBytes), 0);
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
  MPI_Barrier(comm);  // every counter is zero before anyone uses one
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

Status ShmAllreduce::Run(char* out, int64_t count, DataType dtype, ReduceOp op, int divisor,
                         double postscale, const Fill& fill) {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t piece = std::max<int64_t>(1, piece_bytes_ / element);
  const bool finalize = divisor != 1 || postscale != 1.0;
  for (int64_t offset = 0; offset < count; offset += piece) {
    const int64_t n = std::min(piece, count - offset);
    const int64_t half = (pieces_done_++ % 2) * piece_bytes_;
    fill(offset, offset + n, staging_[rank_] + half);
    Barrier();
    // My slice: every rank's contribution combined in rank order, the first
    // two in one pass.
    const int64_t begin = n * rank_ / size_;
    const int64_t end = n * (rank_ + 1) / size_;
    const int64_t at = half + begin * element;
    char* mine = out + (offset + begin) * element;
    for (int r = 1; r < size_; ++r) {
      const void* acc = r == 1 ? static_cast<const void*>(staging_[0] + at) : mine;
      if (!Reduce(dtype, op, mine, acc, staging_[r] + at, end - begin)) {
        return Status::Error(StatusCode::kInvalidArgument, "allreduce of an unreducible dtype");
      }
    }
    if (finalize) FinalizeCopy(dtype, mine, mine, end - begin, divisor, postscale);
    std::memcpy(staging_[rank_] + half + begin * element, mine, (end - begin) * element);
    Barrier();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const int64_t b = n * r / size_;
      const int64_t e = n * (r + 1) / size_;
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
  const bool finalize = divisor != 1 || postscale != 1.0;
  for (int64_t first = 0; first < count; first += piece) {
    const int64_t n = std::min(piece, count - first);
    fill(first, first + n, blocks[rank_] + first * element);
    Barrier();
    // My slice of the piece, combined in rank order as Run does. Not in
    // place in my block: that is one of the inputs, still needed after the
    // first step when there are more than two ranks.
    const int64_t at = (first + n * rank_ / size_) * element;
    const int64_t len = n * (rank_ + 1) / size_ - n * rank_ / size_;
    char* slice = scratch_.data();
    for (int r = 1; r < size_; ++r) {
      const void* acc = r == 1 ? static_cast<const void*>(blocks[0] + at) : slice;
      if (!Reduce(dtype, op, slice, acc, blocks[r] + at, len)) {
        return Status::Error(StatusCode::kInvalidArgument, "allreduce of an unreducible dtype");
      }
    }
    if (finalize) FinalizeCopy(dtype, slice, slice, len, divisor, postscale);
    for (int r = 0; r < size_; ++r) {
      std::memcpy(blocks[r] + at, slice, static_cast<size_t>(len * element));
    }
  }
  Barrier();  // every slice is in every block
  *block = std::move(mine);
  return Status::OK();
}

}  // namespace hvdkeras

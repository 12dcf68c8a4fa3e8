// Allreduce through shared memory among the ranks of one host, and, with a
// cross communicator, the hierarchical allreduce over several hosts (Note
// [hierarchical allreduce] in allreduce_path.h).
//
// Each rank owns a staging area in one MPI shared-memory window, split in
// two halves used by alternate pieces. Per piece of the buffer: every rank
// writes its contribution into its staging half; after a barrier, rank r
// reduces slice r of the piece across all ranks' staging (in rank order, so
// the result is the same everywhere), finishes it (average, postscale) and
// publishes it in its own staging; after a second barrier every rank copies
// the other slices. Across hosts, slice r is allreduced over MPI with the
// other hosts' rank r before it is published. Compared with copying into a
// fused buffer and calling
// MPI_Allreduce, the data crosses memory fewer times (MPI's shared-memory
// path copies through its own cells).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/common.h"
#include "core/mpi_context.h"
#include "core/shm_arena.h"

namespace hvdkeras {

class ShmAllreduce {
 public:
  // Writes this rank's contribution for elements [begin, end) to `dst`.
  using Fill = std::function<void(int64_t begin, int64_t end, char* dst)>;

  // Collective over `host`, whose ranks share one host. The elements of a
  // piece are cut into `slices` slices (at most the host's ranks), reduced
  // by the first `slices` ranks; `cross` (null on one host, and on ranks
  // with no slice) allreduces a slice with the other hosts. Stays inactive
  // (and returns OK) when there is nothing to share (one rank and no cross
  // step) or the window cannot be made on every rank of the host: the
  // caller makes sure all hosts agree. Pieces are as long as the MPI chunks
  // (`chunk_bytes`; 4 MiB when those are off), at least 64 KiB. Results may
  // live in shared memory (RunShared) up to `arena_bytes` per rank; 0 turns
  // that off.
  Status Open(MPI_Comm host, const MpiContext* cross, int slices, int64_t chunk_bytes,
              int64_t arena_bytes);
  // Collective: frees the window. `collective` false just forgets it (after
  // a failure, when the other ranks may not get here).
  void Close(bool collective);
  bool active() const { return active_; }

  // Reduces `count` elements into `out` (which may be where Fill reads from:
  // each piece is filled before any of it is written), then applies
  // FinalizeCopy(divisor, postscale). Every rank calls it with the same
  // count, dtype and op.
  Status Run(char* out, int64_t count, DataType dtype, ReduceOp op, int divisor,
             double postscale, const Fill& fill);

  // Like Run, but the result lands in a block of shared memory that is
  // handed back in *block, to become the outputs' storage (Note [shared
  // outputs] in shm_arena.h). Leaves *block null on every rank, having done
  // nothing else, when some rank has no room or did not want a block
  // (`wanted` false: its outputs cannot live in engine memory): then call
  // Run. Every rank calls it for the same ops whatever it wants, since the
  // arena is made at the first call, collectively.
  Status RunShared(int64_t count, DataType dtype, ReduceOp op, int divisor, double postscale,
                   const Fill& fill, bool wanted, std::shared_ptr<char>* block);

  // Reduce-scatter on one host (no cross step): rank r keeps the `counts[r]`
  // elements that follow the earlier ranks' ones in the Fill layout, each
  // combined in rank order exactly as Run combines it, then finished
  // (Note [one summation order on a host]). Each piece holds an equal part of
  // every rank's block, so every rank reduces at once. `out` receives
  // counts[rank] elements. Every rank calls it with the same counts.
  Status ReduceScatter(const std::vector<int64_t>& counts, char* out, DataType dtype,
                       ReduceOp op, int divisor, double postscale, const Fill& fill);
  // Whether this window holds the whole world, on one host, local ranks in
  // world order (`world_rank` is this rank's): where ReduceScatter may run.
  bool HoldsWorld(int world_rank) const {
    return active_ && cross_ == nullptr && slices_ == size_ && rank_ == world_rank;
  }

 private:
  void Barrier();
  // Elements [*begin, *end) of an n-element piece are this rank's slice.
  void SliceOf(int slice, int64_t n, int64_t* begin, int64_t* end) const;
  // Combines every rank's contribution to elements [at, at+len) (bytes
  // offset `at` in each of `inputs`) into `dst`, in rank order; then the
  // cross step and the finish.
  Status ReduceSlice(const std::vector<char*>& inputs, int64_t at, int64_t len, char* dst,
                     DataType dtype, ReduceOp op, int divisor, double postscale) const;

  bool active_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  ShmArena arena_;
  int64_t arena_bytes_ = 0;
  bool arena_tried_ = false;
  const MpiContext* cross_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  int slices_ = 1;
  int64_t piece_bytes_ = 0;
  uint64_t epoch_ = 0;
  int64_t pieces_done_ = 0;
  std::vector<char> scratch_;          // one rank's slice of a piece (RunShared)
  std::vector<char*> staging_;         // per rank: two halves of piece_bytes_
  std::vector<uint64_t*> arrivals_;    // per rank: barrier counter
  std::vector<int64_t*> posted_;       // per rank: its block's offset in its region, or -1
};

}  // namespace hvdkeras

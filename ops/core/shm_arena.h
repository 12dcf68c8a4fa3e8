// Shared memory that fused allreduce results live in, so that they need not
// be copied out of shared memory into private blocks.
//
// Note [shared outputs]
// ~~~~~~~~~~~~~~~~~~~~~
// Every rank owns a region of shared memory that all ranks of the host map.
// An allreduce through shared memory (ShmAllreduce::RunShared) takes a block
// of the region on every rank, each rank writes its contribution into its
// own block, reduces its slice of the elements across all blocks and writes
// the result into the same slice of every rank's block; the blocks then hold
// the result everywhere and become the outputs' storage as in Note [fused
// outputs] (block_pool.h). Per element and rank that is two passes over
// memory fewer than reducing through a staging area and copying the result
// out. A block goes back to its region when the framework releases the last
// output in it, on any thread; the regions stay mapped until the engine has
// closed the arena and every block is back, so an output may outlive the
// engine. The regions are reserved when they are made (posix_fallocate), so
// a full /dev/shm fails there, cleanly, instead of with SIGBUS later; a
// rank whose region is full takes no block, and then no rank does and the
// op goes the staging way.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/common.h"
#include "core/range_allocator.h"

namespace hvdkeras {

class ShmArena {
 public:
  // Collective over `comm`, whose ranks share one host: makes this rank's
  // region of up to `bytes` (less when /dev/shm has less room) and maps
  // every rank's. Leaves the arena inactive when `bytes` is 0 or some rank
  // could not make or map a region.
  void Open(MPI_Comm comm, int64_t bytes);
  // Drops the engine's hold; mappings go when the last block is released.
  void Close() { state_.reset(); }
  bool active() const { return state_ != nullptr; }

  // A block of `bytes` in this rank's region and its offset there; null (and
  // offset -1) when the region has no free range that long.
  std::shared_ptr<char> Acquire(int64_t bytes, int64_t* offset);
  // Where rank r's region starts in this process.
  char* Region(int r) const { return state_->regions[r]; }

 private:
  struct State {
    std::mutex mu;
    RangeAllocator ranges{0};
    std::vector<char*> regions;
    std::vector<int64_t> sizes;
    int rank = 0;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace hvdkeras

// Pipelined ring collectives over MPI point-to-point messages: allreduce,
// reduce-scatter and allgather that move the least bytes over each rank's
// link at any rank count (Note [ring across hosts] in ring_plan.h). The
// MPI context routes its large collectives here when its ranks span hosts
// (MpiContext::UseRing). Its waits test and sleep instead of spinning in
// MPI (Note [waiting for the ring] in ring_collectives.cc); like every MPI
// wait of the engine, the watchdog bounds them (Note [bounded waits]).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/common.h"
#include "core/ring_plan.h"

namespace hvdkeras {

// Work an allreduce's ring does on the buffer as it goes (Note [fused work in
// the ring] in ring_collectives.cc). Ranges are in bytes of the buffer.
struct RingStages {
  // Before bytes [begin, end) of the input are first read: fill them in.
  std::function<void(int64_t begin, int64_t end)> before_read;
  // Once bytes [begin, end) of the output hold the final sum, before they
  // are sent on or returned: finish them (scale) in place.
  std::function<void(int64_t begin, int64_t end)> on_final;
};

class RingCollectives {
 public:
  // Collective over `comm`: the ring sends on a duplicate of it, so its
  // messages never match anything else the engine sends.
  Status Open(MPI_Comm comm);
  // `collective` false only forgets the duplicate (after a failure, when
  // the other ranks may not get here).
  void Close(bool collective);
  bool active() const { return comm_ != MPI_COMM_NULL; }

  // Reduces `count` elements of `input` into `output` on every rank (they
  // may be the same buffer), calling `stages`' hooks when given.
  Status Allreduce(const void* input, void* output, int64_t count, DataType dtype, ReduceOp op,
                   const RingStages* stages = nullptr) const;
  // Reduces `work` (blocks of counts[r] elements laid end to end, one per
  // rank) and leaves block r on rank r, at its place in `work`; the other
  // blocks of `work` hold partial sums afterwards.
  Status ReduceScatter(void* work, const std::vector<int64_t>& counts, DataType dtype,
                       ReduceOp op) const;
  // Every rank's `bytes[r]` bytes, laid end to end in `buffer`, where each
  // rank's own block is already in place.
  Status Allgather(void* buffer, const std::vector<int64_t>& bytes) const;

 private:
  // Reads this rank's contribution from `input` and builds the result in
  // `work` (which may be `input`).
  Status Run(RingKind kind, const char* input, char* work, const std::vector<int64_t>& block_bytes,
             DataType dtype, ReduceOp op, const RingStages* stages = nullptr) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  mutable std::vector<char> slots_;  // landing places of segments still to be added
};

}  // namespace hvdkeras

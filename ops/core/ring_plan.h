// The schedule of a pipelined ring collective, and when the engine runs one.
// Pure: no MPI (ring_collectives.h runs the schedule over MPI).
//
// Note [ring across hosts]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A ring allreduce moves 2(N-1)/N of the buffer over each rank's link,
// whatever N, which is the least any allreduce can move. MPI's own
// algorithms reach that only for some N: the MPICH that hvdkeras ships halves
// recursively, so at 3 ranks one rank first sends its whole buffer to a
// partner and gets the result back (measured at 36% of a 1 Gbit/s link
// against 95% for a ring). The buffer is cut into N blocks; block b ends up
// owned by rank b. Reduce-scatter: at step t (0..N-2) rank r sends block
// (r-t-1) mod N to rank r+1 and receives block (r-t-2) mod N from rank r-1,
// adding it to its own; after N-1 steps rank r holds the finished block r.
// Allgather: at step t rank r sends block (r-t) mod N and receives block
// (r-t-1) mod N into place. Each step's send is the previous step's receive,
// so the whole collective is one chain of segments: a segment received (and
// added) is sent on at once, and the link never waits for a whole block.
// Every block is finished by one rank and copied to the others, so every rank
// gets the same bits; the reduce-scatter alone is the allreduce's first half
// (the same additions in the same order), so a sharded optimizer's gradients
// equal the allreduced ones on its rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdkeras {

enum class RingKind {
  kAllreduce,      // reduce-scatter, then allgather
  kReduceScatter,  // rank r ends with block r reduced
  kAllgather,      // rank r starts with block r
};

// A piece of a block, in bytes from the start of the working buffer.
struct RingSegment {
  int64_t offset = 0;
  int64_t bytes = 0;
  bool reduce = false;  // added to what is there (reduce-scatter) or written over
};

struct RingSchedule {
  // Receives from rank r-1 in order; sends to rank r+1 in order.
  std::vector<RingSegment> recvs;
  std::vector<RingSegment> sends;
  // sends[i] for i >= ready_sends may start once recvs[i - ready_sends] is
  // done; the first ready_sends hold this rank's own data.
  int64_t ready_sends = 0;
};

// The schedule of `kind` on rank `rank` of `size`, over blocks laid end to end
// (block b is `block_bytes[b]` bytes, a whole number of elements of
// `element` bytes), cut into segments of at most `segment_bytes` (rounded
// down to whole elements, at least one). Every rank's schedule pairs with its
// neighbours': rank r's sends are rank r+1's receives, segment for segment.
RingSchedule PlanRing(RingKind kind, int rank, int size, const std::vector<int64_t>& block_bytes,
                      int64_t element, int64_t segment_bytes);

// Segment size for a buffer of `total_bytes` over `size` ranks: a few
// segments per block so the chain fills quickly, but not so small that
// per-message costs show (64 KiB to 1 MiB).
int64_t RingSegmentBytes(int64_t total_bytes, int size);

// The engine's ring_collectives setting: "auto" (across hosts, from a
// size up), "on" (always, even on one host: for tests) or "off".
enum class RingSetting { kAuto, kOn, kOff };

// Parses the setting once; false (and *setting untouched) for a word it
// does not know.
bool ParseRingSetting(const std::string& text, RingSetting* setting);

// Whether a collective of `bytes` over `ranks` ranks on `hosts` hosts goes
// around the ring; under kAuto from `min_bytes` up, across hosts only.
bool RingWins(RingSetting setting, int hosts, int ranks, int64_t bytes, int64_t min_bytes);

}  // namespace hvdkeras

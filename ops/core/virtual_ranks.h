// A stand-in for a large job's control plane: N virtual ranks in one
// process, each a thread running the real Negotiator (with its coordinator
// at rank 0 and its response cache) over an in-memory transport (Note
// [negotiation transport]). It measures what rank 0 does, the bytes it
// receives and the exchanges of every cycle; the network's time is left to
// a cost model (examples/control_plane_benchmark.py --simulate). No MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdkeras {

struct VirtualJob {
  int ranks = 4;
  int tensors = 300;   // per step
  int steps = 3;       // the first negotiates; the rest should be cached
  int allgathers = 0;  // of the tensors, how many are allgathers (rows per rank differ)
  bool shuffled = true;  // each rank submits a step's tensors in its own order
  int stragglers = 0;    // ranks that submit each step one cycle late
  int64_t cache_capacity = 16384;
  uint64_t seed = 1;
  int ranks_per_host = 8;  // for the liveness tree's plan
  // Each rank hands a step's tensors over in this many cycles, evenly, as a
  // backward pass (or Python submitting one by one) spreads them over the
  // engine's cycles.
  int arrival_cycles = 1;
  // Rank 0's thread on a core of its own and the others on the rest (where
  // the process may use 2 or more), as a real rank 0 has its core to itself
  // (docs/scaling.md: at 64 and 16,384 ranks the medians with and without
  // it were within their run-to-run spread).
  bool rank0_own_core = true;
  // Before each of its cycles rank 0 writes this many bytes of a buffer of
  // its own, outside what is timed (0: never). See Note [a cold rank 0].
  int64_t rank0_evict_bytes = 0;
};

// One kind of exchange in a cycle: how many, and the bytes that reach rank 0
// and that rank 0 sends (per receiving rank for a broadcast).
struct ExchangeCounts {
  int64_t allreduces = 0;
  int64_t allreduce_bytes = 0;  // one rank's vector, summed over the cycle's allreduces
  int64_t gathers = 0;
  int64_t gather_bytes_at_root = 0;
  int64_t broadcasts = 0;
  int64_t broadcast_bytes = 0;
};

struct VirtualCycle {
  int step = 0;
  double rank0_cpu_s = 0.0;  // in the negotiator, not in the transport
  int64_t cached = 0;        // ops agreed from the cache
  int64_t negotiated = 0;    // ops agreed through the coordinator
  ExchangeCounts exchanges;
};

struct VirtualJobReport {
  std::string error;   // "" when the job ran and every rank agreed
  bool agreed = false;  // every rank ran the same names in the same order
  bool exact = false;   // every allgather's rows were what each rank sent
  std::vector<VirtualCycle> cycles;
  std::vector<std::string> order;  // rank 0's ready names, in order, every step
  int64_t rank0_table_peak_bytes = 0;  // the coordinator's tables at their largest (counted)
  int rank0_liveness_sockets = 0;      // what the liveness tree's plan gives rank 0
};

// Runs the job: `ranks` threads, `steps` steps of `tensors` collectives.
VirtualJobReport RunVirtualJob(const VirtualJob& job);

}  // namespace hvdkeras

// Negotiation: every cycle the ranks agree which submitted ops are ready on
// all of them, and in which order they run.
//
// Fast path: one bitwise-AND allreduce over a vector of status bits and one
// bit per response-cache entry (see Note [identical response caches] in
// response_cache.h). Slow path, for new or changed requests: each rank
// sends its requests to rank 0, whose Coordinator checks that the ranks
// agree and answers with responses every rank then executes in the same
// order. Rank 0 also inspects stalls here, since only the coordinator knows
// which ranks are missing.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/coordinator.h"
#include "core/engine_settings.h"
#include "core/negotiation_transport.h"
#include "core/negotiation_transport_timed.h"
#include "core/pending_op.h"
#include "core/request_digest.h"
#include "core/response_cache.h"
#include "core/timeline.h"

namespace hvdkeras {

// What this rank brings to a cycle besides its ops.
struct CycleSignals {
  bool shutdown = false;        // this rank wants to stop
  bool tracing = false;         // this rank records a timeline (rank 0 only)
  bool params_changed = false;  // this rank has new tuning values (rank 0 only)
  // Asked while this rank waits for the others' status bits: an error ends
  // the wait (Note [device errors end the negotiation wait]). Null: none.
  std::function<Status()> health;
  // Why this rank's GPU collectives stopped, "" when they have not (Note [a
  // failed GPU batch ends every rank] in device_session.h).
  std::string device_failure;
};

// What all ranks agreed on in a cycle.
struct Agreement {
  Status error;                 // the negotiation itself failed (MPI)
  bool shutdown = false;        // some rank wants to stop: every rank leaves now
  bool params_update = false;   // rank 0 hands out new tuning values this cycle
  bool tracing = false;         // rank 0 records this cycle's negotiation
  // Some rank's GPU collectives stopped: every rank ends, with this text
  // naming those ranks and their reasons.
  std::string device_failure;
  std::vector<PendingOp*> ready;  // to execute, in this order on every rank
  size_t cached_count = 0;        // ready[0, cached_count) came from the cache
  std::vector<std::pair<PendingOp*, Status>> failed;  // the ranks disagreed
};

// What the negotiation has done since Reset, for hvdkeras.engine_stats().
struct NegotiationCounts {
  int64_t cycles = 0;          // rounds negotiated
  int64_t cached_ops = 0;      // ops agreed by their cache bit alone
  int64_t negotiated_ops = 0;  // ops agreed through rank 0's coordinator
  int64_t evictions = 0;       // cache entries dropped to make room
  int64_t requests_bytes = 0;  // rank 0: the encoded requests it received
  int64_t own_cpu_ns = 0;      // this thread's CPU in Negotiate outside the exchanges
};

class Negotiator {
 public:
  using Clock = std::chrono::steady_clock;

  // Forgets everything (engine start). `transport` (Note [negotiation
  // transport]) must outlive the negotiator's use.
  void Reset(NegotiationTransport* transport, const EngineConfig& config);

  // Records a newly submitted op (join changes how this rank negotiates).
  void NoteSubmitted(const PendingOp& op);

  // One round: decides what is ready everywhere, updates the response cache
  // in the agreed order and returns the agreement. Collective.
  Agreement Negotiate(const PendingOps& pending, const CycleSignals& signals,
                      Clock::time_point now);

  // Rank 0 learns when every rank became ready for the agreed ops and puts
  // it on the timeline. Collective when the agreement says tracing.
  void RecordTimeline(const Agreement& agreement, Timeline* timeline);

  // Drops the stand-ins made for a joined rank this cycle (after execution).
  void ClearStandIns() { stand_ins_.clear(); }

  // Rank 0: warns about, or fails, ops some ranks never submitted.
  void InspectStalls(Clock::time_point now);

  const NegotiationCounts& counts() const { return counts_; }
  // Rank 0: the most its coordinator's tables have held (0 elsewhere).
  int64_t CoordinatorPeakBytes() const {
    return coordinator_ ? coordinator_->PeakTableBytes() : 0;
  }

 private:
  void Classify(const PendingOps& pending, Clock::time_point now);
  void SlowPath(const PendingOps& pending, bool joined_anywhere, Agreement* agreement);
  // Collective: this rank's new requests to rank 0's coordinator, as
  // digests, and in full those rank 0 asks for (negotiation_requests.cc).
  void SendRequests(const std::vector<Request>& mine, Clock::time_point now);
  // Rank 0: hands the coordinator this cycle's requests, from rank 0's own
  // and every other rank's digests (Note [requests by signature hash]).
  // `my_hashes`: the signature hashes of `mine`, in order.
  void AddGathered(const std::vector<Request>& mine, const std::vector<uint64_t>& my_hashes,
                   const std::vector<char>& gathered, const std::vector<size_t>& offsets,
                   const std::vector<Request>& fetched, std::chrono::steady_clock::time_point now);
  PendingOp* StandIn(const Response& response);
  void CountCycle(const Agreement& agreement);
  // Collective: every rank's device failure ("" for none), as one message
  // naming the ranks that failed and why.
  std::string GatherDeviceFailures(const std::string& mine);

  CpuTimedTransport timed_;  // the given transport, its calls' CPU counted
  NegotiationTransport* transport_ = nullptr;  // &timed_
  double stall_check_seconds_ = 0.0;
  double stall_shutdown_seconds_ = 0.0;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::vector<uint64_t> invalid_slots_;       // this cycle's local invalidations
  std::vector<std::unique_ptr<PendingOp>> stand_ins_;  // a joined rank's neutral ops
  bool joined_ = false;                                // this rank called join()
  bool stall_due_ = false;  // rank 0: some name is past the stall shutdown bound
  NegotiationCounts counts_;
  Clock::time_point last_stall_check_;
};

}  // namespace hvdkeras

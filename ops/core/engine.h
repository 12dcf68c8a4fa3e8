// The background engine: one thread per process set owns all of that set's
// communication. Each cycle it takes the ops submitted since the last one,
// negotiates with the set's other ranks which named ops are ready everywhere
// (negotiation.h), runs them fused in one global order (executor.h) and
// completes them. The pieces live in their own classes; this one owns the
// thread and the loop.
//
// Note [process set engines]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every process set is an Engine of its own: its communicator (the set's
// ranks only), submission queue, negotiation, response cache, fusion buffer
// and shared-memory window. Sets therefore negotiate independently, the same
// op name may be in flight in two sets at once, and a set's collectives never
// wait on ranks outside it. Set 0 is the global set, started by init(); the
// others are started and stopped by every member together (Python's
// hvdkeras/engine/process_sets.py decides ids and communicators, so the ids
// agree across ranks). Only the global set traces, autotunes and joins. Engine
// objects are never destroyed, so a submitting thread that looked one up
// never holds a dangling pointer, even while its set is being removed.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/engine_activity.h"
#include "core/engine_settings.h"
#include "core/executor.h"
#include "core/mpi_context.h"
#include "core/negotiation.h"
#include "core/negotiation_transport_mpi.h"
#include "core/pending_op.h"
#include "core/burst_memory.h"
#include "core/submission_queue.h"
#include "core/timeline.h"
#include "core/tuning.h"

namespace hvdkeras {

class Engine {
 public:
  // `set_id`: 0 for the global set (Note [process set engines]).
  explicit Engine(int set_id = 0)
      : set_id_(set_id),
        activity_(set_id == 0 ? "global set" : "process set " + std::to_string(set_id)) {
    activity_.SetWaitingSource([this] { return queue_.DescribeInFlight(); });
  }

  // The global set's engine.
  static Engine& Instance();
  // The engine of process set `id` on this rank; null when this rank is not
  // a member or the set was removed.
  static Engine* ForSet(int id);
  // Starts process set `id` (> 0) on `comm`, the set's own communicator.
  // Collective over the set's ranks. See Note [process set engines].
  static Status StartSet(int id, MPI_Comm comm, const EngineConfig& config);
  // Stops process set `id` on this rank (collective over the set, like
  // Stop()); unknown ids are ignored.
  static void StopSet(int id);

  // Starts the background thread on `comm` (owned by the caller, who frees
  // it after Stop()). Fails if already running. Collective.
  Status Start(MPI_Comm comm, const EngineConfig& config);
  // Asks every rank to stop (at the next cycle), waits for this rank's thread
  // and fails whatever was still queued. Safe to call when not running.
  void Stop();

  bool running() { return queue_.running(); }

  // Any thread: the framework waited for the result of op `name` from
  // `start` to `end`; it goes on the timeline when this rank traces (the
  // engine's thread writes it at its next cycle), and is dropped otherwise.
  void NoteFrameworkWait(const std::string& name, std::chrono::steady_clock::time_point start,
                         std::chrono::steady_clock::time_point end);
  // This rank's place in the engine's set and the set's size (fixed from
  // Start to Stop).
  int rank() const { return mpi_.rank(); }
  int size() const { return mpi_.size(); }

  // Any thread. Fails when not running or when the name is in flight; a
  // refused op is left with the caller.
  Status Enqueue(std::unique_ptr<PendingOp>&& op) { return queue_.Submit(std::move(op)); }
  // All of `ops` or none; see SubmissionQueue::SubmitAll.
  Status EnqueueAll(std::vector<std::unique_ptr<PendingOp>>* ops) { return queue_.SubmitAll(ops); }
  // Emptied ops to fill (Note [recycled ops] in pending_op.h).
  void TakeSpareOps(size_t n, std::vector<std::unique_ptr<PendingOp>>* out) {
    queue_.TakeSpares(n, out);
  }
  std::unique_ptr<PendingOp> TakeSpareOp() { return queue_.TakeSpare(); }

  // The fusion threshold and cycle time in use (autotune changes them).
  void CurrentParams(int64_t* fusion_threshold, double* cycle_time_ms) const {
    *fusion_threshold = current_threshold_.load();
    *cycle_time_ms = current_cycle_time_ms_.load();
  }

  // Totals since Start, for hvdkeras.engine_stats(): [0] ops executed,
  // [1] batches (fused buffers and lone ops) executed, [2] bytes of
  // allreduce and reducescatter input, [3] bytes allgathered onto this rank
  // (every rank's part); seconds [0] executing batches, [1] negotiating
  // while some op was pending (mostly waiting for other ranks to submit
  // it). Any thread.
  void Stats(int64_t counts[4], double seconds[2]) const {
    counts[0] = stat_ops_.load();
    counts[1] = stat_batches_.load();
    counts[2] = stat_bytes_reduced_.load();
    counts[3] = stat_bytes_gathered_.load();
    seconds[0] = stat_execute_seconds_.load();
    seconds[1] = stat_wait_seconds_.load();
  }

  // The negotiation's totals since Start: [0] cycles, [1] ops agreed from
  // the response cache, [2] ops agreed through rank 0, [3] cache evictions,
  // [4] bytes of requests rank 0 received, [5] the negotiation's own CPU
  // nanoseconds (outside its exchanges). Any thread.
  void NegotiationStats(int64_t counts[6]) const {
    counts[0] = stat_cycles_.load();
    counts[1] = stat_cached_ops_.load();
    counts[2] = stat_negotiated_ops_.load();
    counts[3] = stat_evictions_.load();
    counts[4] = stat_requests_bytes_.load();
    counts[5] = stat_negotiation_cpu_ns_.load();
  }

  // "shm", "hierarchical" or "mpi": how large CPU allreduces go, chosen at
  // Start from the hosts' layout (allreduce_path.h).
  const char* allreduce_path() const { return AllreducePathName(allreduce_path_.load()); }

  // Starts (path non-empty) or stops tracing; takes effect at the next cycle.
  // Only rank 0 writes a trace.
  void SetTimeline(const std::string& path, bool mark_cycles) {
    queue_.RequestTimeline(path, mark_cycles);
  }

 private:
  void Loop();
  // One negotiation + execution cycle; returns false once every rank agreed
  // to shut down. Sets *progress when an op completed or new ops arrived.
  bool RunCycle(bool may_wait, bool* progress);
  void ApplyTimelineRequest(const SubmissionQueue::Taken& taken);
  // Moves taken ops into pending_; returns true when this rank asked to stop.
  bool Accept(SubmissionQueue::Taken&& taken, bool* progress);
  // Waits (bounded) for the rest of the bursts the newly taken ops belong
  // to; see Note [burst gathering]. Returns true when this rank asked to stop.
  bool GatherBurst(std::chrono::steady_clock::time_point first_arrival, bool* progress);
  void AgreeOnParams();
  void Finish(std::vector<std::pair<PendingOp*, Status>> results);
  // Fails every op not yet done with `why` and closes the queue; `error`:
  // the engine stopped after one, which later submissions are told.
  void FailEverything(const std::string& why, bool error = true);

  const int set_id_;
  SubmissionQueue queue_;  // shared with the submitting threads

  // Owned by the background thread while it runs.
  EngineConfig config_;
  MpiContext mpi_;
  std::thread thread_;
  PendingOps pending_;
  // Agreed ops waiting for their turn, in pending_ too (Note [priority on
  // the wire] in wire_order.h).
  std::vector<PendingOp*> held_;
  // NoteFrameworkWait's spans, until the engine's thread writes them.
  struct FrameworkWait {
    std::string name;
    std::chrono::steady_clock::time_point start, end;
  };
  std::atomic<bool> tracing_{false};
  std::mutex waits_mu_;
  std::vector<FrameworkWait> waits_;
  void WriteFrameworkWaits();
  MpiNegotiationTransport negotiation_transport_{&mpi_};
  Negotiator negotiator_;
  Executor executor_;
  Tuning tuning_;
  Timeline timeline_;
  BurstMemory bursts_;
  std::vector<std::string> burst_names_;  // the last cycle's agreed ops, for bursts_
  bool shutdown_agreed_ = false;  // the loop ended by a shutdown all ranks saw
  // What this thread is inside, for the watchdog (Note [bounded waits] in
  // watchdog.h); and how many ops were waiting when it was last told.
  EngineActivity activity_;

  // Published for CurrentParams().
  std::atomic<int64_t> current_threshold_{0};
  std::atomic<double> current_cycle_time_ms_{0.0};
  std::atomic<AllreducePath> allreduce_path_{AllreducePath::kMpi};
  // Published for Stats(); written by the engine thread only.
  std::atomic<int64_t> stat_ops_{0};
  std::atomic<int64_t> stat_batches_{0};
  std::atomic<int64_t> stat_bytes_reduced_{0};
  std::atomic<int64_t> stat_bytes_gathered_{0};
  std::atomic<double> stat_execute_seconds_{0.0};
  std::atomic<double> stat_wait_seconds_{0.0};
  std::atomic<int64_t> stat_cycles_{0};
  std::atomic<int64_t> stat_cached_ops_{0};
  std::atomic<int64_t> stat_negotiated_ops_{0};
  std::atomic<int64_t> stat_evictions_{0};
  std::atomic<int64_t> stat_requests_bytes_{0};
  std::atomic<int64_t> stat_negotiation_cpu_ns_{0};
};

}  // namespace hvdkeras

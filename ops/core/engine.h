// The background engine: one thread per process owns all communication.
// Each cycle it takes the ops submitted since the last one, negotiates with
// the other ranks which named ops are ready everywhere (negotiation.h), runs
// them fused in one global order (executor.h) and completes them. The
// pieces live in their own classes; this one owns the thread and the loop.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/engine_settings.h"
#include "core/executor.h"
#include "core/mpi_context.h"
#include "core/negotiation.h"
#include "core/pending_op.h"
#include "core/submission_queue.h"
#include "core/timeline.h"
#include "core/tuning.h"

namespace hvdkeras {

class Engine {
 public:
  static Engine& Instance();

  // Starts the background thread on `comm` (owned by the caller, who frees
  // it after Stop()). Fails if already running. Collective.
  Status Start(MPI_Comm comm, const EngineConfig& config);
  // Asks every rank to stop (at the next cycle), waits for this rank's thread
  // and fails whatever was still queued. Safe to call when not running.
  void Stop();

  bool running() { return queue_.running(); }

  // Any thread. Fails when not running or when the name is in flight; a
  // refused op is left with the caller.
  Status Enqueue(std::unique_ptr<PendingOp>&& op) { return queue_.Submit(std::move(op)); }

  // The fusion threshold and cycle time in use (autotune changes them).
  void CurrentParams(int64_t* fusion_threshold, double* cycle_time_ms) const {
    *fusion_threshold = current_threshold_.load();
    *cycle_time_ms = current_cycle_time_ms_.load();
  }

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
  void AgreeOnParams();
  void Finish(std::vector<std::pair<PendingOp*, Status>> results);
  void FailEverything(const std::string& why);

  SubmissionQueue queue_;  // shared with the submitting threads

  // Owned by the background thread while it runs.
  EngineConfig config_;
  MpiContext mpi_;
  std::thread thread_;
  PendingOps pending_;
  Negotiator negotiator_;
  Executor executor_;
  Tuning tuning_;
  Timeline timeline_;
  bool shutdown_agreed_ = false;  // the loop ended by a shutdown all ranks saw

  // Published for CurrentParams().
  std::atomic<int64_t> current_threshold_{0};
  std::atomic<double> current_cycle_time_ms_{0.0};
};

}  // namespace hvdkeras

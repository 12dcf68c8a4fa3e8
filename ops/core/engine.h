// The background engine: one thread per process owns all communication. It
// collects submitted ops, negotiates with the other ranks which named ops are
// ready everywhere (a cached fast path costing one small allreduce per cycle,
// and a coordinator slow path for new or changed requests), fuses ready ops
// into few buffers and runs the collectives in one global order.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/autotuner.h"
#include "core/collectives.h"
#include "core/coordinator.h"
#include "core/engine_api.h"
#include "core/engine_op.h"
#include "core/message.h"
#include "core/mpi_context.h"
#include "core/response_cache.h"
#include "core/timeline.h"

namespace hvdkeras {

struct EngineConfig {
  int64_t fusion_threshold = int64_t{64} << 20;  // bytes
  double cycle_time_ms = 1.0;                    // idle tick
  int cache_capacity = 1024;                     // 0 disables the fast path
  double stall_check_seconds = 60.0;             // 0 disables the warning
  double stall_shutdown_seconds = 0.0;           // 0: stalled ops wait forever
  std::string timeline_path;                     // rank 0 traces when set
  bool timeline_mark_cycles = false;
  bool autotune = false;                         // tune threshold and cycle time
  bool autotune_threshold_fixed = false;         // the user set it: keep it
  bool autotune_cycle_time_fixed = false;
  std::string autotune_log;                      // CSV of trials (rank 0)
  int64_t allreduce_chunk_bytes = int64_t{1} << 20;  // 0: one MPI call per buffer
  bool shm_allreduce = true;  // reduce through shared memory when all ranks share a host
};

class Engine {
 public:
  static Engine& Instance();

  // Starts the background thread on `comm` (owned by the caller, who frees
  // it after Stop()). Fails if already running.
  Status Start(MPI_Comm comm, const EngineConfig& config);
  // Asks every rank to stop (at the next cycle), waits for this rank's thread
  // and fails whatever was still queued. Safe to call when not running.
  void Stop();

  bool running();
  int rank() const { return mpi_.rank(); }
  int size() const { return mpi_.size(); }

  Status Enqueue(std::unique_ptr<PendingOp> op);

  // The fusion threshold and cycle time in use (autotune changes them).
  void CurrentParams(int64_t* fusion_threshold, double* cycle_time_ms) const {
    *fusion_threshold = current_threshold_.load();
    *cycle_time_ms = current_cycle_time_ms_.load();
  }

  // Starts (path non-empty) or stops tracing; takes effect at the next cycle.
  // Only rank 0 writes a trace.
  void SetTimeline(const std::string& path, bool mark_cycles);

 private:
  enum class State { kNeverStarted, kRunning, kStopped };

  void Loop();
  // One negotiation + execution cycle; returns false once every rank agreed
  // to shut down. Sets *progress when an op completed or new ops arrived.
  bool RunCycle(bool may_wait, bool* progress);
  void Classify(std::chrono::steady_clock::time_point now);
  void SlowPath(bool joined_anywhere, std::vector<PendingOp*>* ready,
                std::vector<std::pair<PendingOp*, Status>>* failed);
  PendingOp* StandIn(const Response& response);
  void RecordNegotiation(const std::vector<PendingOp*>& ready, size_t cached_count,
                         bool tracing);
  void InspectStalls();
  std::vector<Status> Execute(const std::vector<PendingOp*>& ready);
  Status ExecuteBatch(const std::vector<PendingOp*>& batch);
  void Finish(std::vector<std::pair<PendingOp*, Status>> results);
  void FailEverything(const std::string& why);
  void ApplyTimelineRequest();
  void AgreeOnParams();
  void Autotune(int64_t bytes);

  // Shared with submitting threads, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kNeverStarted;
  bool shutdown_requested_ = false;
  // True while the engine thread sleeps on cv_ and nobody has woken it yet:
  // only the first op queued in that time signals (a wake-up is a syscall).
  bool engine_asleep_ = false;
  std::vector<std::unique_ptr<PendingOp>> incoming_;
  std::unordered_set<std::string> in_flight_;
  bool timeline_request_pending_ = false;
  std::string timeline_request_path_;
  bool timeline_request_mark_cycles_ = false;

  // Owned by the background thread.
  EngineConfig config_;
  MpiContext mpi_;
  std::thread thread_;
  std::vector<std::unique_ptr<PendingOp>> pending_;
  std::unordered_map<std::string, PendingOp*> pending_by_name_;
  std::vector<std::unique_ptr<PendingOp>> stand_ins_;  // a joined rank's neutral ops
  bool joined_ = false;                                // this rank called join()
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<uint64_t> invalid_slots_;  // this cycle's local invalidations
  FusionBuffer fusion_buffer_;
  // Fused allreduce results handed out as outputs; up to 256 MiB of released
  // blocks are kept for the next steps.
  BlockPool output_blocks_{int64_t{256} << 20};
  ShmAllreduce shm_;
  bool shutdown_agreed_ = false;  // the loop ended by a shutdown all ranks saw
  Timeline timeline_;
  std::chrono::steady_clock::time_point last_stall_check_;
  std::unique_ptr<Autotuner> tuner_;  // rank 0, when autotuning
  bool params_changed_ = false;       // rank 0 has new values to hand out
  std::atomic<int64_t> current_threshold_{0};
  std::atomic<double> current_cycle_time_ms_{0.0};
};

}  // namespace hvdkeras

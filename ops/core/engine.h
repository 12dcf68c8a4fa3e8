// The background engine: one thread per process owns all communication. It
// collects submitted ops, negotiates with the other ranks which named ops are
// ready everywhere (a cached fast path costing one small allreduce per cycle,
// and a coordinator slow path for new or changed requests), fuses ready ops
// into few buffers and runs the collectives in one global order.
#pragma once

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/coordinator.h"
#include "core/engine_api.h"
#include "core/message.h"
#include "core/mpi_context.h"
#include "core/response_cache.h"

namespace hvdkeras {

struct EngineConfig {
  int64_t fusion_threshold = int64_t{64} << 20;  // bytes
  double cycle_time_ms = 1.0;                    // idle tick
  int cache_capacity = 1024;                     // 0 disables the fast path
};

// A submitted op, owned by the engine until its callback has run.
struct PendingOp {
  Request request;
  std::vector<TensorRef> tensors;
  DoneCallback done;
  int cache_slot = -1;  // slot announced on the fast path, or -1
  bool sent = false;    // sent to the coordinator on the slow path
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

 private:
  enum class State { kNeverStarted, kRunning, kStopped };

  void Loop();
  // One negotiation + execution cycle; returns false once every rank agreed
  // to shut down. Sets *progress when an op completed or new ops arrived.
  bool RunCycle(bool may_wait, bool* progress);
  void Classify();
  void SlowPath(std::vector<PendingOp*>* ready, std::vector<Response>* errors);
  // Runs ready ops in fused batches; returns one status per op.
  std::vector<Status> Execute(const std::vector<PendingOp*>& ready);
  Status ExecuteAllreduce(const std::vector<PendingOp*>& batch);
  Status ExecuteBroadcast(const std::vector<PendingOp*>& batch);
  void Finish(std::vector<std::pair<PendingOp*, Status>> results);
  void FailEverything(const std::string& why);
  char* FusionBuffer(int64_t bytes);

  // Shared with submitting threads, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kNeverStarted;
  bool shutdown_requested_ = false;
  std::vector<std::unique_ptr<PendingOp>> incoming_;
  std::unordered_set<std::string> in_flight_;

  // Owned by the background thread.
  EngineConfig config_;
  MpiContext mpi_;
  std::thread thread_;
  std::vector<std::unique_ptr<PendingOp>> pending_;
  std::unordered_map<std::string, PendingOp*> pending_by_name_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<uint64_t> invalid_slots_;  // this cycle's local invalidations
  std::vector<char> fusion_buffer_;
};

}  // namespace hvdkeras

#include "core/engine.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

#include "core/collectives.h"
#include "core/completion_batch.h"
#include "core/device.h"
#include "core/watchdog.h"
#include "core/wire_order.h"

namespace hvdkeras {

namespace {

using Clock = std::chrono::steady_clock;

// After this many cycles in a row without progress while ops wait on other
// ranks, the engine naps between cycles instead of cycling back to back.
constexpr int kBusyCyclesBeforeNap = 10;

// Note [shutdown wording]
// ~~~~~~~~~~~~~~~~~~~~~~~
// When a rank leaves, the collectives still waiting on the others fail with
// a message containing "hvdkeras was shut down" (here) or "hvdkeras has been
// shut down" (SubmissionQueue::Submit). Python recognises ranks that failed
// only because of that (is_casualty in hvdkeras/engine/failfast.py): such a
// rank does not abort the job (the rank that left is ending it and reports
// itself), and the launcher names the rank that failed first rather than its
// casualties. Change the wording in both places or neither.

// Engines by process set id; see Note [process set engines]. Never
// destroyed: they outlive atexit and any thread that looked one up.
std::mutex registry_mutex;
std::map<int, Engine*>& Registry() {
  static auto* engines = new std::map<int, Engine*>();
  return *engines;
}

}  // namespace

Engine& Engine::Instance() {
  static Engine* global = [] {
    std::lock_guard<std::mutex> lock(registry_mutex);
    Engine* engine = new Engine();
    Registry()[0] = engine;
    return engine;
  }();
  return *global;
}

Engine* Engine::ForSet(int id) {
  if (id == 0) return &Instance();
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = Registry().find(id);
  return it == Registry().end() ? nullptr : it->second;
}

Status Engine::StartSet(int id, MPI_Comm comm, const EngineConfig& config) {
  if (id <= 0) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "process set ids above 0 name added sets; 0 is the global set");
  }
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (Registry().count(id)) {
      return Status::Error(StatusCode::kPreconditionError,
                           "process set " + std::to_string(id) + " is already running");
    }
    engine = new Engine(id);  // kept for good, see the note
  }
  EngineConfig set_config = config;
  set_config.timeline_path.clear();  // the global set alone traces and tunes
  set_config.autotune = false;
  set_config.autotune_log.clear();
  Status s = engine->Start(comm, set_config);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(registry_mutex);
  Registry()[id] = engine;
  return Status::OK();
}

void Engine::StopSet(int id) {
  if (id == 0) return;
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = Registry().find(id);
    if (it == Registry().end()) return;
    engine = it->second;
    Registry().erase(it);
  }
  engine->Stop();
}

Status Engine::Start(MPI_Comm comm, const EngineConfig& config) {
  if (queue_.running()) {
    return Status::Error(StatusCode::kPreconditionError, "the hvdkeras engine is already running");
  }
  if (thread_.joinable()) thread_.join();
  config_ = config;
  current_threshold_ = config.fusion_threshold;
  current_cycle_time_ms_ = config.cycle_time_ms;
  Status s = mpi_.Open(comm);
  if (!s.ok()) return s;
  mpi_.set_allreduce_chunk_bytes(config.allreduce_chunk_bytes);
  s = executor_.Open(&mpi_, config, set_id_);
  if (!s.ok()) return s;
  allreduce_path_ = executor_.allreduce_path();
  stat_ops_ = 0;
  stat_batches_ = 0;
  stat_bytes_reduced_ = 0;
  stat_bytes_gathered_ = 0;
  stat_execute_seconds_ = 0.0;
  stat_wait_seconds_ = 0.0;
  pending_.TakeAll();
  held_.clear();
  negotiator_.Reset(&negotiation_transport_, config);
  tuning_.Start(mpi_.rank(), config);
  shutdown_agreed_ = false;
  queue_.Open(mpi_.rank(), config.timeline_path, config.timeline_mark_cycles);
  activity_.Leave();
  Watchdog::Instance().Watch(&activity_);
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Engine::Stop() {
  queue_.RequestShutdown();
  if (thread_.joinable()) thread_.join();
}

void Engine::Loop() {
  int idle_cycles = 0;
  while (true) {
    bool progress = false;
    const bool may_wait = pending_.empty() || idle_cycles >= kBusyCyclesBeforeNap;
    if (!RunCycle(may_wait, &progress)) break;
    idle_cycles = progress ? 0 : idle_cycles + 1;
  }
  // See Note [shutdown wording].
  FailEverything(
      "hvdkeras was shut down (a rank called hvdkeras.shutdown() or exited) before this "
      "collective completed.",
      /*error=*/false);
  CompletionCycleStart(/*final=*/true);
  timeline_.Close();
  activity_.Enter(EngineActivity::Phase::kClosing);
  executor_.Close(/*collective=*/shutdown_agreed_);
  activity_.Leave();
  mpi_.Close();
}

void Engine::ApplyTimelineRequest(const SubmissionQueue::Taken& taken) {
  if (!taken.timeline_requested || mpi_.rank() != 0) return;
  if (taken.timeline_path.empty()) {
    timeline_.Close();
    return;
  }
  const std::string error = timeline_.Open(taken.timeline_path, taken.timeline_mark_cycles);
  if (!error.empty()) std::fprintf(stderr, "hvdkeras: WARNING: %s\n", error.c_str());
}

bool Engine::Accept(SubmissionQueue::Taken&& taken, bool* progress) {
  ApplyTimelineRequest(taken);
  if (!taken.ops.empty()) *progress = true;
  for (auto& op : taken.ops) {
    negotiator_.NoteSubmitted(*op);
    bursts_.Count(op->request.name);
    pending_.Add(std::move(op));
  }
  return taken.shutdown;
}

bool Engine::GatherBurst(Clock::time_point first_arrival, bool* progress) {
  const auto deadline =
      first_arrival + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  while (bursts_.Incomplete()) {
    const double left_ms =
        std::chrono::duration<double, std::milli>(deadline - Clock::now()).count();
    if (left_ms <= 0) break;
    // Woken once the burst's missing members could all be queued, not by
    // each of them: every wake-up costs both this thread and the submitting
    // one a context switch, which on a busy host also delays the other ranks.
    if (Accept(queue_.Take(/*may_wait=*/true, left_ms, bursts_.missing()), progress)) return true;
  }
  return false;
}

bool Engine::RunCycle(bool may_wait, bool* progress) {
  CompletionCycleStart(/*final=*/false);  // Note [completion batches]
  SubmissionQueue::Taken taken = queue_.Take(may_wait, config_.cycle_time_ms);
  const bool new_ops = !taken.ops.empty();
  const auto first_arrival = new_ops ? taken.ops.front()->enqueued : Clock::now();
  bursts_.BeginCount();
  for (const auto& op : pending_.all()) bursts_.Count(op->request.name);
  bool stop = Accept(std::move(taken), progress);
  // Only newly arrived ops wait for companions, so an op stuck on another
  // rank does not delay every later cycle.
  if (!stop && new_ops) stop = GatherBurst(first_arrival, progress);
  const auto now = Clock::now();
  negotiator_.InspectStalls(now);
  if (timeline_.active()) timeline_.CycleStart();
  WriteFrameworkWaits();

  // A GPU communicator that met an error on its own (a lost peer, a
  // network fault) leaves kernels waiting for what never comes: the error
  // ends this engine, and its aborted communicator frees those kernels.
  const Status device_health = executor_.DeviceHealth();
  if (!device_health.ok()) {
    FailEverything("the GPU communicator failed, so hvdkeras stopped on this rank: " +
                   device_health.message);
    return false;
  }
  // Note [device errors end the negotiation wait] in negotiation_wait.cc.
  auto health = [this] {
    Status s = executor_.DeviceHealth();
    if (!s.ok()) s.message = "the GPU communicator failed: " + s.message;
    return s;
  };
  const CycleSignals signals{stop, timeline_.active(), tuning_.has_news(), health,
                             executor_.DeviceFailure()};
  const bool waiting = !pending_.empty();
  activity_.Enter(EngineActivity::Phase::kNegotiating);
  Agreement agreement = negotiator_.Negotiate(pending_, signals, now);
  const auto negotiated = Clock::now();
  const NegotiationCounts& counts = negotiator_.counts();
  stat_cycles_ = counts.cycles;
  stat_cached_ops_ = counts.cached_ops;
  stat_negotiated_ops_ = counts.negotiated_ops;
  stat_evictions_ = counts.evictions;
  stat_requests_bytes_ = counts.requests_bytes;
  stat_negotiation_cpu_ns_ = counts.own_cpu_ns;
  if (waiting) {
    stat_wait_seconds_ = stat_wait_seconds_.load() +
                         std::chrono::duration<double>(negotiated - now).count();
  }
  if (!agreement.error.ok()) {
    activity_.Leave();
    FailEverything("hvdkeras negotiation failed: " + agreement.error.message);
    return false;
  }
  if (!agreement.device_failure.empty()) {
    // Note [a failed GPU batch ends every rank] in device_session.h.
    activity_.Leave();
    FailEverything("hvdkeras stopped on every rank: " + agreement.device_failure);
    return false;
  }
  if (agreement.shutdown) {
    activity_.Leave();
    shutdown_agreed_ = true;  // every rank leaves its loop here, together
    return false;
  }
  if (agreement.params_update) AgreeOnParams();
  negotiator_.RecordTimeline(agreement, &timeline_);

  // Note [priority on the wire] in wire_order.h: some agreed ops may wait.
  const std::vector<PendingOp*> ready = TakeRunnable(std::move(agreement.ready), &held_);
  if (!ready.empty()) {
    // Reused from cycle to cycle: Note [recycled ops].
    burst_names_.resize(ready.size());
    for (size_t i = 0; i < ready.size(); ++i) burst_names_[i] = ready[i]->request.name;
    bursts_.Remember(burst_names_);
    const std::string what =
        "'" + burst_names_[0] + "'" +
        (ready.size() > 1 ? " and " + std::to_string(ready.size() - 1) + " more" : "");
    activity_.Enter(EngineActivity::Phase::kExecuting, &what);
  }
  // Note [device time] in device.h: GPU batches are timed on the device
  // while tracing or tuning, and counted when the device finished them.
  const bool time_device = timeline_.active() || tuning_.measuring();
  executor_.set_time_device(time_device);
  const std::vector<Status> statuses = executor_.Execute(
      ready, config_.fusion_threshold, timeline_.active() ? &timeline_ : nullptr);
  for (const DeviceSpan& span : executor_.TakeDeviceSpans()) {
    for (const std::string& name : span.names) {
      timeline_.DeviceSpan(name, span.op, span.start, span.end);
    }
    if (tuning_.measuring()) tuning_.Record(span.bytes, span.end);
  }
  if (!ready.empty()) {
    int64_t bytes = 0, reduced = 0, gathered = 0;
    for (const PendingOp* op : ready) {
      const int64_t op_bytes = op->request.TotalBytes();
      const OpType type = op->request.op_type;
      if (!time_device || op->request.device != DeviceKind::kGpu) bytes += op_bytes;
      if (type == OpType::kAllreduce || type == OpType::kReducescatter) reduced += op_bytes;
      if (type == OpType::kAllgather) gathered += AllgatheredBytes(*op);
    }
    stat_ops_ += static_cast<int64_t>(ready.size());
    stat_batches_ = executor_.batches_run();
    stat_bytes_reduced_ += reduced;
    stat_bytes_gathered_ += gathered;
    stat_execute_seconds_ = stat_execute_seconds_.load() +
                            std::chrono::duration<double>(Clock::now() - negotiated).count();
    if (tuning_.measuring()) tuning_.Record(bytes);
  } else if (tuning_.measuring()) {
    tuning_.Record(0);
  }
  std::vector<std::pair<PendingOp*, Status>> results = std::move(agreement.failed);
  for (size_t i = 0; i < ready.size(); ++i) {
    if (ready[i]->done) results.emplace_back(ready[i], statuses[i]);
  }
  negotiator_.ClearStandIns();
  if (!results.empty() || !ready.empty()) *progress = true;
  activity_.Enter(EngineActivity::Phase::kCompleting);
  Finish(std::move(results));
  activity_.Leave();
  if (timeline_.active()) timeline_.Flush();
  return true;
}

void Engine::NoteFrameworkWait(const std::string& name, std::chrono::steady_clock::time_point start,
                               std::chrono::steady_clock::time_point end) {
  if (!tracing_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(waits_mu_);
  waits_.push_back({name, start, end});
}

void Engine::WriteFrameworkWaits() {
  tracing_.store(timeline_.active(), std::memory_order_relaxed);
  std::vector<FrameworkWait> waits;
  {
    std::lock_guard<std::mutex> lock(waits_mu_);
    if (waits_.empty()) return;
    waits.swap(waits_);
  }
  for (const FrameworkWait& w : waits) timeline_.WaitSpan(w.name, w.start, w.end);
}

void Engine::AgreeOnParams() {
  tuning_.Agree(mpi_, &config_);
  current_threshold_ = config_.fusion_threshold;
  current_cycle_time_ms_ = config_.cycle_time_ms;
}

void Engine::Finish(std::vector<std::pair<PendingOp*, Status>> results) {
  if (results.empty()) return;
  // Take the finished ops out of the tables before running callbacks, so a
  // callback that submits the next op under the same name is accepted.
  std::vector<PendingOp*> finished;
  finished.reserve(results.size());
  for (auto& [op, status] : results) {
    op->finished = true;
    finished.push_back(op);
  }
  queue_.Release(finished);
  std::vector<std::unique_ptr<PendingOp>> owned = pending_.TakeFinished();
  {
    CompletionBatch batch;  // Note [completion batches]
    for (auto& [op, status] : results) {
      if (!status.ok()) DiscardReadyEvents(op);
      op->done(status);
    }
  }
  queue_.Recycle(&owned);  // Note [recycled ops]
}

void Engine::FailEverything(const std::string& why, bool error) {
  std::vector<std::unique_ptr<PendingOp>> leftovers = queue_.Close(error ? why : "");
  held_.clear();
  for (auto& op : pending_.TakeAll()) leftovers.push_back(std::move(op));
  negotiator_.ClearStandIns();
  const Status status = Status::Error(StatusCode::kAborted, why);
  CompletionBatch batch;  // Note [completion batches]
  for (auto& op : leftovers) {
    DiscardReadyEvents(op.get());
    if (op->done) op->done(status);
  }
}

}  // namespace hvdkeras

#include "core/engine.h"

#include <algorithm>
#include <cstdio>

#include "core/scaling.h"

namespace hvdkeras {

namespace {

using Clock = std::chrono::steady_clock;

// Status bits of word 0 of the negotiation vector. They are stored inverted
// (1 = "no") so that the bitwise AND across ranks answers "does any rank ...".
constexpr uint64_t kNoUnsentRequests = 1;
constexpr uint64_t kNoShutdownRequest = 2;
constexpr uint64_t kNoJoinedRank = 4;
constexpr uint64_t kNoTimeline = 8;          // only rank 0 clears it
constexpr uint64_t kNoCoordinatorNews = 16;  // only rank 0 clears it
constexpr uint64_t kNoParamUpdate = 32;      // only rank 0 clears it

// After this many cycles in a row without progress while ops wait on other
// ranks, the engine naps between cycles instead of cycling back to back.
constexpr int kBusyCyclesBeforeNap = 10;

// Waits for a nonblocking MPI request without hogging a core: spin briefly
// (the common case: the other ranks are already there), then yield, then
// sleep for a small fraction of the time waited so far.
Status WaitPolitely(MPI_Request* request) {
  const auto start = Clock::now();
  int done = 0;
  while (true) {
    int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return Status::Error(StatusCode::kUnknown, "MPI_Test failed");
    if (done) return Status::OK();
    const auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(
        std::min<Clock::duration>(waited / 20, std::chrono::microseconds(500)));
  }
}

}  // namespace

Engine& Engine::Instance() {
  static Engine* engine = new Engine();  // never destroyed: outlives atexit
  return *engine;
}

Status Engine::Start(MPI_Comm comm, const EngineConfig& config) {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kRunning) {
    return Status::Error(StatusCode::kPreconditionError, "the hvdkeras engine is already running");
  }
  if (thread_.joinable()) thread_.join();
  config_ = config;
  current_threshold_ = config.fusion_threshold;
  current_cycle_time_ms_ = config.cycle_time_ms;
  Status s = mpi_.Open(comm);
  if (!s.ok()) return s;
  mpi_.set_allreduce_chunk_bytes(config.allreduce_chunk_bytes);
  if (config.shm_allreduce) {
    s = shm_.Open(mpi_.comm(), config.allreduce_chunk_bytes);
    if (!s.ok()) return s;
  }
  shutdown_agreed_ = false;
  pending_.clear();
  pending_by_name_.clear();
  stand_ins_.clear();
  incoming_.clear();
  in_flight_.clear();
  joined_ = false;
  cache_ = ResponseCache(static_cast<size_t>(std::max(0, config.cache_capacity)));
  coordinator_.reset(mpi_.rank() == 0 ? new Coordinator(mpi_.size()) : nullptr);
  timeline_request_pending_ = !config.timeline_path.empty();
  timeline_request_path_ = config.timeline_path;
  timeline_request_mark_cycles_ = config.timeline_mark_cycles;
  last_stall_check_ = Clock::now();
  tuner_.reset();
  params_changed_ = false;
  if (config.autotune && mpi_.rank() == 0) {
    const TuningParams start{config.fusion_threshold, config.cycle_time_ms};
    tuner_.reset(new Autotuner(start, config.autotune_threshold_fixed,
                               config.autotune_cycle_time_fixed));
    params_changed_ = !(tuner_->current() == start);
    if (!config.autotune_log.empty()) {
      if (FILE* f = std::fopen(config.autotune_log.c_str(), "w")) {
        std::fprintf(f, "trial,fusion_threshold_bytes,cycle_time_ms,score_bytes_per_second,"
                        "best_so_far,final\n");
        std::fclose(f);
      }
    }
  }
  shutdown_requested_ = false;
  state_ = State::kRunning;
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Engine::running() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kRunning;
}

void Engine::SetTimeline(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_request_pending_ = true;
  timeline_request_path_ = path;
  timeline_request_mark_cycles_ = mark_cycles;
}

Status Engine::Enqueue(std::unique_ptr<PendingOp> op) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string& name = op->request.name;
  if (state_ == State::kNeverStarted) {
    return Status::Error(StatusCode::kPreconditionError,
                         "hvdkeras has not been initialized: call hvdkeras.init() before "
                         "running collective '" + name + "'.");
  }
  if (state_ == State::kStopped || shutdown_requested_) {
    return Status::Error(StatusCode::kPreconditionError,
                         "hvdkeras has been shut down, so collective '" + name +
                             "' cannot run. Call hvdkeras.init() again to restart it.");
  }
  if (!in_flight_.insert(name).second) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "A collective named '" + name + "' is already in flight on rank " +
                             std::to_string(mpi_.rank()) +
                             ": concurrent collectives need distinct names.");
  }
  op->request.rank = mpi_.rank();
  op->enqueued = Clock::now();
  incoming_.push_back(std::move(op));
  const bool wake = engine_asleep_;
  engine_asleep_ = false;
  lock.unlock();  // the woken engine thread can take the lock at once
  if (wake) cv_.notify_one();
  return Status::OK();
}

void Engine::Loop() {
  int idle_cycles = 0;
  while (true) {
    bool progress = false;
    const bool may_wait = pending_.empty() || idle_cycles >= kBusyCyclesBeforeNap;
    if (!RunCycle(may_wait, &progress)) break;
    idle_cycles = progress ? 0 : idle_cycles + 1;
  }
  FailEverything(
      "hvdkeras was shut down (a rank called hvdkeras.shutdown() or exited) before this "
      "collective completed.");
  timeline_.Close();
  shm_.Close(/*collective=*/shutdown_agreed_);
  mpi_.Close();
}

void Engine::ApplyTimelineRequest() {
  std::string path;
  bool mark_cycles;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!timeline_request_pending_) return;
    timeline_request_pending_ = false;
    path = timeline_request_path_;
    mark_cycles = timeline_request_mark_cycles_;
  }
  if (mpi_.rank() != 0) return;
  if (path.empty()) {
    timeline_.Close();
    return;
  }
  const std::string error = timeline_.Open(path, mark_cycles);
  if (!error.empty()) std::fprintf(stderr, "hvdkeras: WARNING: %s\n", error.c_str());
}

bool Engine::RunCycle(bool may_wait, bool* progress) {
  std::vector<std::unique_ptr<PendingOp>> arrived;
  bool shutdown;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (may_wait && incoming_.empty() && !shutdown_requested_) {
      engine_asleep_ = true;
      cv_.wait_for(lock, std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
      engine_asleep_ = false;
    }
    arrived.swap(incoming_);
    shutdown = shutdown_requested_;
  }
  ApplyTimelineRequest();
  if (!arrived.empty()) *progress = true;
  for (auto& op : arrived) {
    if (op->request.op_type == OpType::kJoin) joined_ = true;
    pending_by_name_[op->request.name] = op.get();
    pending_.push_back(std::move(op));
  }
  const auto now = Clock::now();
  if (coordinator_) InspectStalls();
  if (timeline_.active()) timeline_.CycleStart();

  // Fast path: one bitwise AND over [status | cache hits | not-invalidated].
  Classify(now);
  const size_t words = (cache_.num_slots() + 63) / 64;
  std::vector<uint64_t> bits(1 + 2 * words, 0);
  bits[0] = kNoUnsentRequests | kNoShutdownRequest | kNoJoinedRank | kNoTimeline |
            kNoCoordinatorNews | kNoParamUpdate;
  if (shutdown) bits[0] &= ~kNoShutdownRequest;
  if (joined_) bits[0] &= ~kNoJoinedRank;
  if (timeline_.active()) bits[0] &= ~kNoTimeline;
  if (coordinator_ && coordinator_->has_ready()) bits[0] &= ~kNoCoordinatorNews;
  if (params_changed_) bits[0] &= ~kNoParamUpdate;
  for (size_t w = 0; w < words; ++w) bits[1 + words + w] = ~uint64_t{0};
  for (const auto& op : pending_) {
    if (op->sent) continue;
    if (op->cache_slot >= 0) {
      bits[1 + op->cache_slot / 64] |= uint64_t{1} << (op->cache_slot % 64);
    } else {
      bits[0] &= ~kNoUnsentRequests;
    }
  }
  for (uint64_t slot : invalid_slots_) {
    bits[1 + words + slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, bits.data(), static_cast<int>(bits.size()), MPI_UINT64_T, MPI_BAND,
                 mpi_.comm(), &request);
  Status waited = WaitPolitely(&request);
  if (!waited.ok()) {
    FailEverything("hvdkeras negotiation failed: " + waited.message);
    return false;
  }
  if (!(bits[0] & kNoShutdownRequest)) {
    shutdown_agreed_ = true;  // every rank leaves its loop here, together
    return false;
  }
  if (!(bits[0] & kNoParamUpdate)) AgreeOnParams();
  const bool joined_anywhere = !(bits[0] & kNoJoinedRank);
  const bool tracing = !(bits[0] & kNoTimeline);

  // Entries some rank found stale are dropped everywhere; local ops that
  // announced them go to the coordinator instead. While any rank has joined,
  // everything goes through the coordinator, which knows who joined.
  bool any_invalidated = false;
  for (size_t slot = 0; slot < words * 64; ++slot) {
    if (bits[1 + words + slot / 64] & (uint64_t{1} << (slot % 64))) continue;
    any_invalidated = true;
    bits[1 + slot / 64] &= ~(uint64_t{1} << (slot % 64));
    if (slot < cache_.num_slots()) cache_.Erase(static_cast<int>(slot));
  }
  std::vector<PendingOp*> ready;
  std::vector<std::pair<int, PendingOp*>> by_slot;  // cache hits in slot order
  for (const auto& op : pending_) {
    if (op->sent || op->cache_slot < 0) continue;
    if (joined_anywhere || cache_.Lookup(op->request.name) != op->cache_slot) {
      op->cache_slot = -1;
    } else {
      by_slot.emplace_back(op->cache_slot, op.get());
    }
  }
  std::sort(by_slot.begin(), by_slot.end());
  for (const auto& [slot, op] : by_slot) {
    if (bits[1 + slot / 64] & (uint64_t{1} << (slot % 64))) {
      op->response = cache_.SharedResponse(slot);
      ready.push_back(op);
    }
  }
  const size_t cached_count = ready.size();

  std::vector<std::pair<PendingOp*, Status>> results;
  if (!(bits[0] & kNoUnsentRequests) || !(bits[0] & kNoCoordinatorNews) || any_invalidated ||
      joined_anywhere) {
    SlowPath(joined_anywhere, &ready, &results);
  }

  // The cache changes identically on every rank: touch what hit, then add
  // what the coordinator approved, both in execution order. Nothing is added
  // while a rank has joined (its stand-ins have no requests of their own).
  if (!joined_anywhere) {
    for (size_t i = 0; i < ready.size(); ++i) {
      if (i < cached_count) {
        cache_.Touch(ready[i]->cache_slot);
      } else if (ready[i]->request.op_type != OpType::kJoin) {
        cache_.Put(ready[i]->request, ready[i]->response);
      }
    }
  }
  RecordNegotiation(ready, cached_count, tracing);

  const std::vector<Status> statuses = Execute(ready);
  if (tuner_) {
    int64_t bytes = 0;
    for (PendingOp* op : ready) bytes += op->request.TotalBytes();
    Autotune(bytes);
  }
  for (size_t i = 0; i < ready.size(); ++i) {
    if (ready[i]->done) results.emplace_back(ready[i], statuses[i]);
  }
  stand_ins_.clear();
  if (!results.empty() || !ready.empty()) *progress = true;
  Finish(std::move(results));
  if (timeline_.active()) timeline_.Flush();
  return true;
}

void Engine::Classify(Clock::time_point now) {
  invalid_slots_.clear();
  // An op that waits on the fast path for long is moved to the coordinator,
  // which is the only place that can tell which ranks are missing.
  double demote_after = 0.0;
  for (double limit : {config_.stall_check_seconds, config_.stall_shutdown_seconds}) {
    if (limit > 0) demote_after = demote_after > 0 ? std::min(demote_after, limit) : limit;
  }
  demote_after *= 0.25;
  for (auto& op : pending_) {
    if (op->sent) continue;
    op->cache_slot = -1;
    if (joined_ || op->request.op_type == OpType::kJoin) continue;
    const int slot = cache_.Lookup(op->request.name);
    if (slot < 0) continue;
    const double waited = std::chrono::duration<double>(now - op->enqueued).count();
    if (!cache_.Signature(slot).SameSignature(op->request) ||
        (demote_after > 0 && waited > demote_after)) {
      invalid_slots_.push_back(static_cast<uint64_t>(slot));
    } else {
      op->cache_slot = slot;
    }
  }
}

void Engine::SlowPath(bool joined_anywhere, std::vector<PendingOp*>* ready,
                      std::vector<std::pair<PendingOp*, Status>>* failed) {
  const auto now = Clock::now();
  std::vector<Request> mine;
  for (auto& op : pending_) {
    if (op->sent || op->cache_slot >= 0) continue;
    op->sent = true;
    op->request.age_seconds = std::chrono::duration<double>(now - op->enqueued).count();
    mine.push_back(op->request);
  }
  const std::string encoded = EncodeRequests(mine);
  const int size = mpi_.size();
  int my_bytes = static_cast<int>(encoded.size());
  std::vector<int> counts(mpi_.rank() == 0 ? size : 0);
  MPI_Gather(&my_bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, mpi_.comm());
  std::vector<int> displs(counts.size(), 0);
  std::vector<char> gathered;
  if (mpi_.rank() == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      total += counts[r];
    }
    gathered.resize(std::max(total, 1));
  }
  MPI_Gatherv(encoded.data(), my_bytes, MPI_BYTE, gathered.data(), counts.data(), displs.data(),
              MPI_BYTE, 0, mpi_.comm());

  std::string reply;
  if (coordinator_) {
    for (int r = 0; r < size; ++r) {
      std::vector<Request> requests;
      DecodeRequests(gathered.data() + displs[r], counts[r], &requests);
      for (const Request& q : requests) coordinator_->Add(q, now);
    }
    reply = EncodeResponses(coordinator_->TakeReady());
  }
  int reply_bytes = static_cast<int>(reply.size());
  MPI_Bcast(&reply_bytes, 1, MPI_INT, 0, mpi_.comm());
  reply.resize(reply_bytes);
  MPI_Bcast(reply.data(), reply_bytes, MPI_BYTE, 0, mpi_.comm());

  std::vector<Response> responses;
  DecodeResponses(reply.data(), reply.size(), &responses);
  for (Response& response : responses) {
    auto it = pending_by_name_.find(response.name);
    PendingOp* op = it == pending_by_name_.end() ? nullptr : it->second;
    if (response.kind == Response::Kind::kError) {
      if (op) failed->emplace_back(op, Status::Error(StatusCode::kPreconditionError, response.error));
      continue;
    }
    if (response.agreed.op_type == OpType::kJoin) joined_ = false;
    if (!op && joined_anywhere) op = StandIn(response);
    if (!op) continue;
    op->response = std::make_shared<const Response>(std::move(response));
    ready->push_back(op);
  }
}

PendingOp* Engine::StandIn(const Response& response) {
  // This rank has joined: take part with a neutral contribution (no rows for
  // gathers, zeros for sums, the identity for min/max/product) and discard
  // the result.
  auto op = std::make_unique<PendingOp>();
  op->request = response.agreed;
  op->request.rank = mpi_.rank();
  const OpType type = response.agreed.op_type;
  for (size_t t = 0; t < response.agreed.shapes.size(); ++t) {
    TensorRef ref;
    ref.dtype = response.agreed.dtypes[t];
    ref.shape = response.agreed.shapes[t];
    if (type == OpType::kAllgather || type == OpType::kAlltoall) ref.shape[0] = 0;
    const int64_t bytes = NumElements(ref.shape) * static_cast<int64_t>(DataTypeSize(ref.dtype));
    op->scratch.emplace_back(std::max<int64_t>(bytes, 1));
    FillNeutral(ref.dtype, response.agreed.reduce_op, op->scratch.back().data(),
                NumElements(ref.shape));
    ref.input = op->scratch.back().data();
    ref.output = op->scratch.back().data();
    PendingOp* owner = op.get();
    ref.allocate_output = [owner](const Shape& shape, void** data) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      owner->scratch.emplace_back(std::max<int64_t>(n * 8, 1));
      *data = owner->scratch.back().data();
      return Status::OK();
    };
    op->tensors.push_back(std::move(ref));
  }
  if (type == OpType::kAlltoall) op->request.splits.assign(mpi_.size(), 0);
  stand_ins_.push_back(std::move(op));
  return stand_ins_.back().get();
}

void Engine::RecordNegotiation(const std::vector<PendingOp*>& ready, size_t cached_count,
                               bool tracing) {
  if (!tracing) return;
  // Rank 0 learns when every rank became ready: from the coordinator for
  // negotiated ops, from one gather of wait times for cached ones.
  const int size = mpi_.size();
  const auto now = Clock::now();
  std::vector<double> ages(cached_count);
  for (size_t i = 0; i < cached_count; ++i) {
    ages[i] = std::chrono::duration<double>(now - ready[i]->enqueued).count();
  }
  std::vector<double> all_ages(mpi_.rank() == 0 ? cached_count * size : 0);
  if (cached_count > 0) {
    MPI_Gather(ages.data(), static_cast<int>(cached_count), MPI_DOUBLE, all_ages.data(),
               static_cast<int>(cached_count), MPI_DOUBLE, 0, mpi_.comm());
  }
  if (!timeline_.active()) return;
  for (size_t i = 0; i < ready.size(); ++i) {
    const Request& r = ready[i]->request;
    std::vector<Clock::time_point> times(size, now);
    if (i < cached_count) {
      for (int rank = 0; rank < size; ++rank) {
        times[rank] = now - std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(all_ages[rank * cached_count + i]));
      }
    } else {
      auto it = coordinator_->ready_times().find(r.name);
      if (it != coordinator_->ready_times().end()) times = it->second;
    }
    Clock::time_point first = now;
    for (int rank = 0; rank < size; ++rank) {
      if (times[rank] != Clock::time_point()) first = std::min(first, times[rank]);
    }
    timeline_.NegotiateStart(r.name, r.op_type, first);
    for (int rank = 0; rank < size; ++rank) {
      if (times[rank] != Clock::time_point()) timeline_.RankReady(r.name, rank, times[rank]);
    }
    timeline_.NegotiateEnd(r.name, now);
  }
}

void Engine::Finish(std::vector<std::pair<PendingOp*, Status>> results) {
  if (results.empty()) return;
  // Take the finished ops out of the tables before running callbacks, so a
  // callback that submits the next op under the same name is accepted.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [op, status] : results) {
      in_flight_.erase(op->request.name);
      op->finished = true;
    }
  }
  std::vector<std::unique_ptr<PendingOp>> finished;
  std::vector<std::unique_ptr<PendingOp>> still_pending;
  finished.reserve(results.size());
  still_pending.reserve(pending_.size() - std::min(pending_.size(), results.size()));
  for (auto& p : pending_) {
    if (p->finished) {
      pending_by_name_.erase(p->request.name);
      finished.push_back(std::move(p));
    } else {
      still_pending.push_back(std::move(p));
    }
  }
  pending_.swap(still_pending);
  for (auto& [op, status] : results) op->done(status);
}

void Engine::FailEverything(const std::string& why) {
  std::vector<std::unique_ptr<PendingOp>> leftovers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = State::kStopped;
    for (auto& op : incoming_) leftovers.push_back(std::move(op));
    incoming_.clear();
    in_flight_.clear();
  }
  for (auto& op : pending_) leftovers.push_back(std::move(op));
  pending_.clear();
  pending_by_name_.clear();
  stand_ins_.clear();
  const Status status = Status::Error(StatusCode::kAborted, why);
  for (auto& op : leftovers) {
    if (op->done) op->done(status);
  }
}

}  // namespace hvdkeras

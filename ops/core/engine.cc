#include "core/engine.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/fusion_planner.h"
#include "core/scaling.h"

namespace hvdkeras {

namespace {

using Clock = std::chrono::steady_clock;

// Status bits of word 0 of the negotiation vector. They are stored inverted
// (1 = "no") so that the bitwise AND across ranks answers "does any rank ...".
constexpr uint64_t kNoUnsentRequests = 1;
constexpr uint64_t kNoShutdownRequest = 2;

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

FusionKey KeyOf(const Request& r) {
  FusionKey key;
  key.op_type = r.op_type;
  if (r.op_type == OpType::kAllreduce) {
    key.dtype = r.dtypes[0];
    key.reduce_op = r.reduce_op;
    key.prescale = r.prescale;
    key.postscale = r.postscale;
  } else {
    key.dtype = DataType::kUInt8;  // broadcasts move raw bytes
    key.root_rank = r.root_rank;
  }
  return key;
}

int64_t TensorBytes(const TensorRef& t) {
  return NumElements(t.shape) * static_cast<int64_t>(DataTypeSize(t.dtype));
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
  Status s = mpi_.Open(comm);
  if (!s.ok()) return s;
  pending_.clear();
  pending_by_name_.clear();
  incoming_.clear();
  in_flight_.clear();
  cache_ = ResponseCache(static_cast<size_t>(std::max(0, config.cache_capacity)));
  coordinator_.reset(mpi_.rank() == 0 ? new Coordinator(mpi_.size()) : nullptr);
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

Status Engine::Enqueue(std::unique_ptr<PendingOp> op) {
  std::lock_guard<std::mutex> lock(mu_);
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
  incoming_.push_back(std::move(op));
  cv_.notify_one();
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
  mpi_.Close();
}

bool Engine::RunCycle(bool may_wait, bool* progress) {
  std::vector<std::unique_ptr<PendingOp>> arrived;
  bool shutdown;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (may_wait && incoming_.empty() && !shutdown_requested_) {
      cv_.wait_for(lock, std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
    }
    arrived.swap(incoming_);
    shutdown = shutdown_requested_;
  }
  if (!arrived.empty()) *progress = true;
  for (auto& op : arrived) {
    pending_by_name_[op->request.name] = op.get();
    pending_.push_back(std::move(op));
  }

  // Fast path: one bitwise AND over [status | cache hits | not-invalidated].
  Classify();
  const size_t words = (cache_.num_slots() + 63) / 64;
  std::vector<uint64_t> bits(1 + 2 * words, 0);
  bits[0] = kNoUnsentRequests | kNoShutdownRequest;
  if (shutdown) bits[0] &= ~kNoShutdownRequest;
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
  if (!(bits[0] & kNoShutdownRequest)) return false;

  // Entries some rank found stale are dropped everywhere; local ops that
  // announced them go to the coordinator instead.
  bool any_invalidated = false;
  for (size_t slot = 0; slot < words * 64; ++slot) {
    if (bits[1 + words + slot / 64] & (uint64_t{1} << (slot % 64))) continue;
    any_invalidated = true;
    bits[1 + slot / 64] &= ~(uint64_t{1} << (slot % 64));
    if (slot < cache_.num_slots()) cache_.Erase(static_cast<int>(slot));
    for (auto& op : pending_) {
      if (op->cache_slot == static_cast<int>(slot)) op->cache_slot = -1;
    }
  }

  // Cached ops that every rank announced, in slot order.
  std::vector<PendingOp*> ready;
  std::map<int, PendingOp*> by_slot;
  for (const auto& op : pending_) {
    if (!op->sent && op->cache_slot >= 0) by_slot[op->cache_slot] = op.get();
  }
  for (const auto& [slot, op] : by_slot) {
    if (bits[1 + slot / 64] & (uint64_t{1} << (slot % 64))) ready.push_back(op);
  }
  const size_t cached_count = ready.size();

  std::vector<Response> errors;
  if (!(bits[0] & kNoUnsentRequests) || any_invalidated) SlowPath(&ready, &errors);

  // The cache changes identically on every rank: touch what hit, then add
  // what the coordinator approved, both in execution order.
  for (size_t i = 0; i < ready.size(); ++i) {
    if (i < cached_count) {
      cache_.Touch(ready[i]->cache_slot);
    } else {
      cache_.Put(ready[i]->request);
    }
  }

  std::vector<std::pair<PendingOp*, Status>> results;
  for (const Response& e : errors) {
    auto it = pending_by_name_.find(e.name);
    if (it != pending_by_name_.end()) {
      results.emplace_back(it->second, Status::Error(StatusCode::kPreconditionError, e.error));
    }
  }
  const std::vector<Status> statuses = Execute(ready);
  for (size_t i = 0; i < ready.size(); ++i) results.emplace_back(ready[i], statuses[i]);
  if (!results.empty()) *progress = true;
  Finish(std::move(results));
  return true;
}

void Engine::Classify() {
  invalid_slots_.clear();
  for (auto& op : pending_) {
    if (op->sent) continue;
    op->cache_slot = -1;
    const int slot = cache_.Lookup(op->request.name);
    if (slot < 0) continue;
    if (cache_.Signature(slot).SameSignature(op->request)) {
      op->cache_slot = slot;
    } else {
      invalid_slots_.push_back(static_cast<uint64_t>(slot));
    }
  }
}

void Engine::SlowPath(std::vector<PendingOp*>* ready, std::vector<Response>* errors) {
  std::vector<Request> mine;
  for (auto& op : pending_) {
    if (op->sent || op->cache_slot >= 0) continue;
    op->sent = true;
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
  if (mpi_.rank() == 0) {
    for (int r = 0; r < size; ++r) {
      std::vector<Request> requests;
      DecodeRequests(gathered.data() + displs[r], counts[r], &requests);
      for (const Request& q : requests) coordinator_->Add(q);
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
    if (response.kind == Response::Kind::kError) {
      errors->push_back(std::move(response));
      continue;
    }
    auto it = pending_by_name_.find(response.name);
    if (it != pending_by_name_.end()) ready->push_back(it->second);
  }
}

std::vector<Status> Engine::Execute(const std::vector<PendingOp*>& ready) {
  std::vector<FusionItem> items;
  items.reserve(ready.size());
  for (PendingOp* op : ready) items.push_back({KeyOf(op->request), op->request.TotalBytes()});
  std::vector<Status> statuses(ready.size());
  for (const std::vector<int>& batch_indices : PlanFusion(items, config_.fusion_threshold)) {
    std::vector<PendingOp*> batch;
    for (int i : batch_indices) batch.push_back(ready[i]);
    const Status s = batch[0]->request.op_type == OpType::kAllreduce ? ExecuteAllreduce(batch)
                                                                     : ExecuteBroadcast(batch);
    for (int i : batch_indices) statuses[i] = s;
  }
  return statuses;
}

char* Engine::FusionBuffer(int64_t bytes) {
  if (static_cast<int64_t>(fusion_buffer_.size()) < bytes) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

Status Engine::ExecuteAllreduce(const std::vector<PendingOp*>& batch) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int divisor = first.reduce_op == ReduceOp::kAverage ? mpi_.size() : 1;
  const size_t element = DataTypeSize(dtype);

  if (batch.size() == 1 && batch[0]->tensors.size() == 1) {
    // A lone tensor is reduced straight into its output: no fusion buffer.
    const TensorRef& t = batch[0]->tensors[0];
    const int64_t n = NumElements(t.shape);
    const void* send = t.input == t.output ? nullptr : t.input;
    if (first.prescale != 1.0) {
      ScaleCopy(dtype, t.input, t.output, n, first.prescale);
      send = nullptr;
    }
    Status s = mpi_.Allreduce(send, t.output, n, dtype, first.reduce_op);
    if (!s.ok()) return s;
    FinalizeCopy(dtype, t.output, t.output, n, divisor, first.postscale);
    return Status::OK();
  }

  int64_t total = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) total += NumElements(t.shape);
  }
  char* buffer = FusionBuffer(total * element);
  int64_t offset = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      const int64_t n = NumElements(t.shape);
      ScaleCopy(dtype, t.input, buffer + offset * element, n, first.prescale);
      offset += n;
    }
  }
  Status s = mpi_.Allreduce(nullptr, buffer, total, dtype, first.reduce_op);
  if (!s.ok()) return s;
  offset = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      const int64_t n = NumElements(t.shape);
      FinalizeCopy(dtype, buffer + offset * element, t.output, n, divisor, first.postscale);
      offset += n;
    }
  }
  return Status::OK();
}

Status Engine::ExecuteBroadcast(const std::vector<PendingOp*>& batch) {
  const int root = batch[0]->request.root_rank;
  const bool is_root = mpi_.rank() == root;
  if (is_root) {  // the root's outputs are its inputs
    for (PendingOp* op : batch) {
      for (const TensorRef& t : op->tensors) {
        if (t.input != t.output) std::memcpy(t.output, t.input, TensorBytes(t));
      }
    }
  }
  if (batch.size() == 1 && batch[0]->tensors.size() == 1) {
    const TensorRef& t = batch[0]->tensors[0];
    return mpi_.Broadcast(t.output, TensorBytes(t), root);
  }
  int64_t total = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) total += TensorBytes(t);
  }
  char* buffer = FusionBuffer(total);
  int64_t offset = 0;
  if (is_root) {
    for (PendingOp* op : batch) {
      for (const TensorRef& t : op->tensors) {
        std::memcpy(buffer + offset, t.input, TensorBytes(t));
        offset += TensorBytes(t);
      }
    }
  }
  Status s = mpi_.Broadcast(buffer, total, root);
  if (!s.ok() || is_root) return s;
  offset = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      std::memcpy(t.output, buffer + offset, TensorBytes(t));
      offset += TensorBytes(t);
    }
  }
  return Status::OK();
}

void Engine::Finish(std::vector<std::pair<PendingOp*, Status>> results) {
  if (results.empty()) return;
  // Take the finished ops out of the tables before running callbacks, so a
  // callback that submits the next op under the same name is accepted.
  std::unordered_set<PendingOp*> done_ops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [op, status] : results) {
      in_flight_.erase(op->request.name);
      done_ops.insert(op);
    }
  }
  std::vector<std::unique_ptr<PendingOp>> finished;
  std::vector<std::unique_ptr<PendingOp>> still_pending;
  for (auto& p : pending_) {
    if (done_ops.count(p.get())) {
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
  const Status status = Status::Error(StatusCode::kAborted, why);
  for (auto& op : leftovers) {
    if (op->done) op->done(status);
  }
}

}  // namespace hvdkeras

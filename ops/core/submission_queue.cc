#include "core/submission_queue.h"

#include <algorithm>
#include <chrono>

namespace hvdkeras {

void SubmissionQueue::Open(int rank, const std::string& timeline_path,
                           bool timeline_mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_ = rank;
  incoming_.clear();
  in_flight_.clear();
  in_flight_count_ = 0;
  shutdown_requested_ = false;
  stop_reason_.clear();
  timeline_requested_ = !timeline_path.empty();
  timeline_path_ = timeline_path;
  timeline_mark_cycles_ = timeline_mark_cycles;
  state_ = State::kRunning;
}

bool SubmissionQueue::running() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kRunning;
}

Status SubmissionQueue::CheckSubmittable(const std::string& name) {
  if (state_ == State::kNeverStarted) {
    return Status::Error(StatusCode::kPreconditionError,
                         "hvdkeras has not been initialized: call hvdkeras.init() before "
                         "running collective '" + name + "'.");
  }
  if (state_ == State::kStopped || shutdown_requested_) {
    // See Note [shutdown wording].
    // A rank whose own collectives had all completed when another rank's
    // failure stopped the engine (a GPU collective completes once queued on
    // the stream) learns the reason here, at its next collective.
    return Status::Error(StatusCode::kPreconditionError,
                         "hvdkeras has been shut down, so collective '" + name +
                             "' cannot run" +
                             (stop_reason_.empty() ? "" : ": it stopped after an error: " +
                                                              stop_reason_ + ".") +
                             " Call hvdkeras.init() again to restart it.");
  }
  auto it = in_flight_.find(name);
  if (it != in_flight_.end() && it->second) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "A collective named '" + name + "' is already in flight on rank " +
                             std::to_string(rank_) +
                             ": concurrent collectives need distinct names.");
  }
  return Status::OK();
}

void SubmissionQueue::MarkInFlight(const std::string& name) {
  auto [it, added] = in_flight_.try_emplace(name, true);
  if (!added) it->second = true;
  ++in_flight_count_;
}

Status SubmissionQueue::Submit(std::unique_ptr<PendingOp>&& op) {
  std::unique_lock<std::mutex> lock(mu_);
  const Status ok = CheckSubmittable(op->request.name);
  if (!ok.ok()) return ok;
  MarkInFlight(op->request.name);
  Append(std::move(op), std::chrono::steady_clock::now());
  WakeIfDue(&lock);
  return Status::OK();
}

void SubmissionQueue::Append(std::unique_ptr<PendingOp>&& op,
                             std::chrono::steady_clock::time_point now) {
  op->request.rank = rank_;
  op->enqueued = now;
  incoming_.push_back(std::move(op));
}

void SubmissionQueue::WakeIfDue(std::unique_lock<std::mutex>* lock) {
  const bool wake = engine_asleep_ && incoming_.size() >= wake_at_;
  if (wake) engine_asleep_ = false;
  lock->unlock();  // the woken engine thread can take the lock at once
  if (wake) cv_.notify_one();
}

Status SubmissionQueue::SubmitAll(std::vector<std::unique_ptr<PendingOp>>* ops) {
  std::unique_lock<std::mutex> lock(mu_);
  for (size_t i = 0; i < ops->size(); ++i) {
    const std::string& name = (*ops)[i]->request.name;
    Status ok = CheckSubmittable(name);
    if (!ok.ok()) {
      for (size_t j = 0; j < i; ++j) {  // take back what this call marked
        in_flight_[(*ops)[j]->request.name] = false;
        --in_flight_count_;
      }
      return ok;
    }
    MarkInFlight(name);  // also catches a name given twice in `ops`
  }
  const auto now = std::chrono::steady_clock::now();
  for (auto& op : *ops) Append(std::move(op), now);
  ops->clear();
  WakeIfDue(&lock);
  return Status::OK();
}

std::unique_ptr<PendingOp> SubmissionQueue::TakeSpare() {
  std::lock_guard<std::mutex> lock(mu_);
  if (spares_.empty()) return nullptr;
  std::unique_ptr<PendingOp> op = std::move(spares_.back());
  spares_.pop_back();
  return op;
}

void SubmissionQueue::TakeSpares(size_t n, std::vector<std::unique_ptr<PendingOp>>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  while (n-- > 0 && !spares_.empty()) {
    out->push_back(std::move(spares_.back()));
    spares_.pop_back();
  }
}

void SubmissionQueue::RequestShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutdown_requested_ = true;
  cv_.notify_all();
}

void SubmissionQueue::RequestTimeline(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  timeline_requested_ = true;
  timeline_path_ = path;
  timeline_mark_cycles_ = mark_cycles;
}

SubmissionQueue::Taken SubmissionQueue::Take(bool may_wait, double wait_ms, size_t wake_at) {
  Taken taken;
  std::unique_lock<std::mutex> lock(mu_);
  wake_at = std::max<size_t>(wake_at, 1);
  if (may_wait && incoming_.size() < wake_at && !shutdown_requested_) {
    engine_asleep_ = true;
    wake_at_ = wake_at;
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double, std::milli>(wait_ms));
    cv_.wait_until(lock, until, [this] { return !engine_asleep_ || shutdown_requested_; });
    engine_asleep_ = false;
    wake_at_ = 1;
  }
  taken.ops.swap(incoming_);
  taken.shutdown = shutdown_requested_;
  if (timeline_requested_) {
    timeline_requested_ = false;
    taken.timeline_requested = true;
    taken.timeline_path = timeline_path_;
    taken.timeline_mark_cycles = timeline_mark_cycles_;
  }
  return taken;
}

void SubmissionQueue::Release(const std::vector<PendingOp*>& finished) {
  std::lock_guard<std::mutex> lock(mu_);
  for (PendingOp* op : finished) {
    auto it = in_flight_.find(op->request.name);
    if (it == in_flight_.end() || !it->second) continue;
    it->second = false;
    --in_flight_count_;
  }
  SweepMarked(&in_flight_, in_flight_count_, [](bool flying) { return !flying; });
}

void SubmissionQueue::Recycle(std::vector<std::unique_ptr<PendingOp>>* finished) {
  for (auto& op : *finished) op->Empty();  // outside the lock: runs destructors
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& op : *finished) {
    if (spares_.size() >= kMaxSpares) break;
    spares_.push_back(std::move(op));
  }
}

std::string SubmissionQueue::DescribeInFlight() {
  constexpr size_t kNamesShown = 3;
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_count_ == 0) return "";
  std::string text = std::to_string(in_flight_count_) + " collective(s) (";
  size_t shown = 0;
  for (const auto& [name, flying] : in_flight_) {
    if (!flying) continue;
    if (shown == kNamesShown) {
      text += ", ...";
      break;
    }
    text += (shown++ ? ", '" : "'") + name + "'";
  }
  return text + ")";
}

std::vector<std::unique_ptr<PendingOp>> SubmissionQueue::Close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = State::kStopped;
  if (stop_reason_.empty()) stop_reason_ = reason;
  in_flight_.clear();
  in_flight_count_ = 0;
  std::vector<std::unique_ptr<PendingOp>> leftovers;
  leftovers.swap(incoming_);
  return leftovers;
}

}  // namespace hvdkeras

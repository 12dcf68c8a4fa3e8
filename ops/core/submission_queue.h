// The hand-over between the framework's threads, which submit ops, and the
// engine's thread, which takes them at the start of each cycle. This is the
// only state of the engine that more than one thread touches; one mutex
// guards all of it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/pending_op.h"

namespace hvdkeras {

class SubmissionQueue {
 public:
  // What the engine's thread takes at the start of a cycle.
  struct Taken {
    std::vector<std::unique_ptr<PendingOp>> ops;  // in submission order
    bool shutdown = false;                         // this rank asked to stop
    bool timeline_requested = false;               // start (path set) or stop tracing
    std::string timeline_path;
    bool timeline_mark_cycles = false;
  };

  // Accepts submissions from now on (engine start). `rank` is stamped on
  // every request; a non-empty `timeline_path` is handed over as a first
  // timeline request.
  void Open(int rank, const std::string& timeline_path, bool timeline_mark_cycles);
  bool running();

  // Framework threads. Fails (without taking the op) before Open, after a
  // shutdown, or while an op of the same name is in flight.
  Status Submit(std::unique_ptr<PendingOp>&& op);
  // Framework threads: queues every op of `ops` in order, or none of them
  // (the error names the first op refused, as Submit would).
  Status SubmitAll(std::vector<std::unique_ptr<PendingOp>>* ops);
  // Framework threads: moves up to `n` emptied ops into `out`, to be filled
  // instead of allocated (Note [recycled ops] in pending_op.h).
  void TakeSpares(size_t n, std::vector<std::unique_ptr<PendingOp>>* out);
  // One emptied op, or null when none is kept.
  std::unique_ptr<PendingOp> TakeSpare();
  void RequestShutdown();
  void RequestTimeline(const std::string& path, bool mark_cycles);

  // Engine thread. With `may_wait`, sleeps up to `wait_ms` unless something
  // is already queued; the submission that brings the queue to `wake_at` ops
  // wakes it (a shutdown or timeline request always does).
  Taken Take(bool may_wait, double wait_ms, size_t wake_at = 1);
  // The names of these finished ops may be submitted again.
  void Release(const std::vector<PendingOp*>& finished);
  // Engine thread: keeps finished ops, after their callbacks ran, for
  // TakeSpares; empties them first.
  void Recycle(std::vector<std::unique_ptr<PendingOp>>* finished);
  // Any thread: how many collectives are in flight and a few of their names,
  // e.g. "2 collective(s) ('a', 'b')"; "" when none.
  std::string DescribeInFlight();
  // Refuses submissions from now on; returns the ops never taken. `reason`:
  // the error that stopped the engine ("" for an orderly end), which later
  // refusals repeat until the next Open; the first one given is kept.
  std::vector<std::unique_ptr<PendingOp>> Close(const std::string& reason = "");

 private:
  enum class State { kNeverStarted, kRunning, kStopped };
  static constexpr size_t kMaxSpares = 4096;

  // With mu_ held: why `name` cannot be submitted now, or OK.
  Status CheckSubmittable(const std::string& name);
  void MarkInFlight(const std::string& name);
  // With mu_ held: stamps the op and queues it.
  void Append(std::unique_ptr<PendingOp>&& op, std::chrono::steady_clock::time_point now);
  // Releases `lock`, then wakes the sleeping engine if the queue reached its count.
  void WakeIfDue(std::unique_lock<std::mutex>* lock);

  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kNeverStarted;
  int rank_ = 0;
  bool shutdown_requested_ = false;
  std::string stop_reason_;  // why the engine stopped after an error
  // True while the engine thread sleeps and nobody has woken it yet: only
  // the first op queued in that time signals (a wake-up is a syscall).
  bool engine_asleep_ = false;
  size_t wake_at_ = 1;  // while asleep: the queue length that wakes it
  std::vector<std::unique_ptr<PendingOp>> incoming_;
  // Names seen in flight, and whether they still are. A finished name is
  // marked, not erased, so that the names a training loop submits every
  // step cost no allocation; marked entries are swept once they dominate.
  std::unordered_map<std::string, bool> in_flight_;
  size_t in_flight_count_ = 0;
  std::vector<std::unique_ptr<PendingOp>> spares_;
  bool timeline_requested_ = false;
  std::string timeline_path_;
  bool timeline_mark_cycles_ = false;
};

}  // namespace hvdkeras

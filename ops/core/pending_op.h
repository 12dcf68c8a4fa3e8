// A submitted op as the engine tracks it from submission to completion, and
// the table of this rank's ops that have not finished yet.
#pragma once

#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/engine_api.h"
#include "core/message.h"

namespace hvdkeras {

// Note [recycled ops]
// ~~~~~~~~~~~~~~~~~~~
// A step of separate collectives builds an op per tensor on the framework's
// thread, and the engine's thread frees it: every allocation crosses threads,
// which defeats the allocator's per-thread caches (about a tenth of the CPU of
// 100 separate 40-byte allreduces went to malloc's slow paths). So finished
// ops go back to the submission queue emptied, vectors keeping their storage,
// and the next submissions (every Enqueue* in engine_api.cc) fill them again;
// the tables that track names mark finished entries instead of erasing them,
// and sweep them out once they dominate.

// Forgets the marked entries of a name table (Note [recycled ops]) once
// they outnumber the live ones, so names made up per call do not pile up.
template <typename Map, typename IsMarked>
void SweepMarked(Map* table, size_t live, IsMarked is_marked) {
  if (table->size() <= 2 * live + 4096) return;
  for (auto it = table->begin(); it != table->end();) {
    it = is_marked(it->second) ? table->erase(it) : std::next(it);
  }
}

struct PendingOp {
  Request request;
  std::vector<TensorRef> tensors;
  DoneCallback done;                  // null for a joined rank's stand-in
  std::shared_ptr<const Response> response;  // what the ranks agreed on (shared with the cache)
  int32_t* join_result = nullptr;     // join: where the last joined rank goes
  int cache_slot = -1;                // slot announced on the fast path, or -1
  uint64_t slot_version = 0;          // the slot's version when it was found (Note [classified once])
  bool sent = false;                  // sent to the coordinator
  bool finished = false;              // executed or failed; its callback is due
  std::chrono::steady_clock::time_point enqueued;
  std::vector<std::vector<char>> scratch;  // buffers owned by a stand-in

  // Drops what the op holds for its framework (callbacks, agreed response,
  // scratch) but keeps its vectors' storage: see Note [recycled ops]. The
  // one who fills it again sets every field of `request` and `tensors`.
  void Empty() {
    for (TensorRef& t : tensors) {  // their captures may own framework state
      t.allocate_output = nullptr;
      t.adopt_output = nullptr;
      t.reuse_input = nullptr;
      t.receive_splits = nullptr;
      t.input = nullptr;
      t.output = nullptr;
    }
    done = nullptr;
    response.reset();
    join_result = nullptr;
    cache_slot = -1;
    slot_version = 0;
    sent = false;
    finished = false;
    scratch.clear();
    request.splits.clear();
    request.age_seconds = 0.0;
  }
};

// This rank's submitted ops that have not finished, in submission order,
// findable by name. Used by the engine's thread only.
class PendingOps {
 public:
  void Add(std::unique_ptr<PendingOp> op) {
    by_name_[op->request.name] = op.get();
    ops_.push_back(std::move(op));
  }
  PendingOp* Find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : it->second;
  }
  bool empty() const { return ops_.empty(); }
  const std::vector<std::unique_ptr<PendingOp>>& all() const { return ops_; }

  // Removes the ops marked finished and hands them over (the caller runs
  // their callbacks, then drops or recycles them).
  std::vector<std::unique_ptr<PendingOp>> TakeFinished() {
    std::vector<std::unique_ptr<PendingOp>> finished;
    size_t kept = 0;
    for (auto& op : ops_) {
      if (op->finished) {
        by_name_[op->request.name] = nullptr;  // Note [recycled ops]: marked, not erased
        finished.push_back(std::move(op));
      } else {
        ops_[kept++] = std::move(op);
      }
    }
    ops_.resize(kept);
    SweepMarked(&by_name_, ops_.size(), [](const PendingOp* op) { return op == nullptr; });
    return finished;
  }

  std::vector<std::unique_ptr<PendingOp>> TakeAll() {
    by_name_.clear();
    std::vector<std::unique_ptr<PendingOp>> all;
    all.swap(ops_);
    return all;
  }

 private:
  std::vector<std::unique_ptr<PendingOp>> ops_;
  std::unordered_map<std::string, PendingOp*> by_name_;
};

}  // namespace hvdkeras

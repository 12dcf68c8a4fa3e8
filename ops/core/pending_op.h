// A submitted op as the engine tracks it from submission to completion, and
// the table of this rank's ops that have not finished yet.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/engine_api.h"
#include "core/message.h"

namespace hvdkeras {

struct PendingOp {
  Request request;
  std::vector<TensorRef> tensors;
  DoneCallback done;                  // null for a joined rank's stand-in
  std::shared_ptr<const Response> response;  // what the ranks agreed on (shared with the cache)
  int32_t* join_result = nullptr;     // join: where the last joined rank goes
  int cache_slot = -1;                // slot announced on the fast path, or -1
  bool sent = false;                  // sent to the coordinator
  bool finished = false;              // executed or failed; its callback is due
  std::chrono::steady_clock::time_point enqueued;
  std::vector<std::vector<char>> scratch;  // buffers owned by a stand-in
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
  // their callbacks, then drops them).
  std::vector<std::unique_ptr<PendingOp>> TakeFinished() {
    std::vector<std::unique_ptr<PendingOp>> finished, kept;
    for (auto& op : ops_) {
      if (op->finished) {
        by_name_.erase(op->request.name);
        finished.push_back(std::move(op));
      } else {
        kept.push_back(std::move(op));
      }
    }
    ops_.swap(kept);
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

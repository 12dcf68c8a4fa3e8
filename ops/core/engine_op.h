// A submitted op as the engine tracks it from submission to completion.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
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

}  // namespace hvdkeras

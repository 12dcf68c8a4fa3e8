// What framework bindings see of the engine: submit named collectives over
// raw buffers and get a completion callback. No MPI and no framework types.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

// One tensor of a request: its input buffer and an output buffer of the same
// size, allocated by the caller (they may be the same buffer).
struct TensorRef {
  const void* input = nullptr;
  void* output = nullptr;
  DataType dtype = DataType::kFloat32;
  Shape shape;
};

// Called exactly once, from the engine's thread, when the op finished or
// failed. Buffers must stay valid until then.
using DoneCallback = std::function<void(const Status&)>;

// Submit an allreduce of one or more tensors of one dtype; all of them are
// reduced in the same fused call. Returns an error (and does not call `done`)
// if the op cannot be queued, e.g. the engine is not running.
Status EnqueueAllreduce(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                        double prescale, double postscale, DoneCallback done);

// Submit a broadcast of one or more tensors (any dtypes) from root_rank.
Status EnqueueBroadcast(const std::string& name, std::vector<TensorRef> tensors, int root_rank,
                        DoneCallback done);

bool EngineRunning();

}  // namespace hvdkeras

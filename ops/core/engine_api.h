// What framework bindings see of the engine: submit named collectives over
// raw buffers and get a completion callback. No MPI and no framework types.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

// Allocates an output of `shape` once the engine knows it (allgather,
// alltoall, reducescatter) and stores its address in *data.
using AllocateOutput = std::function<Status(const Shape& shape, void** data)>;

// Makes `data`, which lies in engine memory kept alive by `owner`, the
// output: the framework wraps it as its output tensor and drops `owner` when
// that tensor is released. Only for outputs of the input's shape.
using AdoptOutput = std::function<Status(std::shared_ptr<char> owner, void* data)>;

// One tensor of a request.
struct TensorRef {
  const void* input = nullptr;
  // For broadcast: an output buffer of the input's size, allocated by the
  // caller (it may be the input buffer). Allreduce leaves it null and sets
  // allocate_output and adopt_output: the engine then either adopts a slice
  // of its fused buffer as the output (no copy back) or asks for a buffer.
  void* output = nullptr;
  // Allocates the output once the engine knows it needs one: for ops whose
  // output shape is decided by negotiation, and for allreduce (which may
  // reuse the input buffer).
  AllocateOutput allocate_output;
  AdoptOutput adopt_output;
  // Allreduce: makes the input buffer the output when the framework allows
  // it (nothing else holds the input) and stores it in *data; false if not.
  std::function<bool(void** data)> reuse_input;
  // Alltoall: receives the number of rows that came from each rank.
  std::function<void(const std::vector<int64_t>&)> receive_splits;
  DataType dtype = DataType::kFloat32;
  Shape shape;
  // GPU tensors (see Note [stream order] in device.h): the device ordinal
  // (-1: host memory) and the framework's stream that produced the input and
  // will consume the output. `ready` is filled in when the op is queued.
  int device = -1;
  void* framework_stream = nullptr;
  void* ready = nullptr;
  // A joined rank's stand-in: contributes the neutral element and receives
  // into scratch memory (a GPU batch provides both on the device).
  bool neutral = false;
};

// Called exactly once, from the engine's thread, when the op finished or
// failed. Buffers must stay valid until then.
using DoneCallback = std::function<void(const Status&)>;

// Each Enqueue* returns an error (and does not call `done`) if the op cannot
// be queued, e.g. the engine is not running or the name is already in use.
// `process_set` names the set of ranks the op runs on (0: all ranks; see
// Note [process set engines] in engine.h); ranks, sizes and splits are then
// those of the set.

// Allreduce of one or more tensors of one dtype, reduced in one fused call.
// `priority` above 0 orders it among other agreed ops (Note [priority on the
// wire] in wire_order.h); 0 runs it as soon as every rank has submitted it.
Status EnqueueAllreduce(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                        double prescale, double postscale, int process_set,
                        DoneCallback done, int priority = 0);

// The framework waited for the result of op `name` (of `process_set`) from
// `start` to `end`: a span on the timeline when this rank traces, nothing
// otherwise. Any thread.
void NoteFrameworkWait(int process_set, const std::string& name,
                       std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end);

// Allreduce of each tensor as a collective of its own, named names[i]: what
// the ranks negotiate and what errors name are those of one EnqueueAllreduce
// per tensor, but the ops are built from recycled ones and queued in one
// submission (Note [recycled ops] in pending_op.h). All are queued or none
// (then `done` is never called); `done` runs once per tensor.
Status EnqueueAllreduceEach(const std::vector<std::string>& names,
                            std::vector<TensorRef> tensors, ReduceOp op, double prescale,
                            double postscale, int process_set, const DoneCallback& done);

// Broadcast of one or more tensors (any dtypes) from root_rank.
Status EnqueueBroadcast(const std::string& name, std::vector<TensorRef> tensors, int root_rank,
                        int process_set, DoneCallback done);

// Allgather along the first dimension (which may differ per rank).
Status EnqueueAllgather(const std::string& name, std::vector<TensorRef> tensors,
                        int process_set, DoneCallback done);

// Alltoall of one tensor: splits[r] rows go to rank r.
Status EnqueueAlltoall(const std::string& name, TensorRef tensor, std::vector<int64_t> splits,
                       int process_set, DoneCallback done);

// Reduce (Sum or Average) then scatter the first dimension: rank r gets rows
// [start_r, end_r), the first (rows % size) ranks one row more than the rest.
Status EnqueueReducescatter(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                            double prescale, double postscale, int process_set,
                            DoneCallback done);

// Completes once every rank has submitted it.
Status EnqueueBarrier(const std::string& name, int process_set, DoneCallback done);

// Marks this rank as joined: until every rank has joined, it takes part in
// the others' collectives with neutral contributions. `last_joined_rank`
// receives the rank that joined last. Joining is global: there is no
// process_set argument.
Status EnqueueJoin(const std::string& name, int32_t* last_joined_rank, DoneCallback done);

bool EngineRunning();

// The GPU whose memory `data` lies in, for bindings handed device buffers
// without their device (XLA's custom calls and FFI handlers).
Status PointerDevice(const void* data, int* device);

// See Note [completion batches] in completion_batch.h. `batch_end` runs on
// an engine's thread after each batch of done callbacks; `cycle_start` runs
// on it at the start of every cycle (at least every cycle time, even when
// idle), and once more with `final` true when the engine stops. One set of
// hooks per process; a later call replaces it. InsideCompletionBatch() is
// true on an engine thread while it runs such a batch.
struct CompletionHooks {
  void (*batch_end)() = nullptr;
  void (*cycle_start)(bool final) = nullptr;
};
void SetCompletionHooks(const CompletionHooks& hooks);
bool InsideCompletionBatch();

}  // namespace hvdkeras

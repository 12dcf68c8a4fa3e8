// Builds requests from framework submissions and hands them to the engine.
#include "core/engine_api.h"

#include <memory>

#include "core/engine.h"

namespace hvdkeras {

namespace {

Status Submit(const std::string& name, OpType type, std::vector<TensorRef> tensors,
              ReduceOp op, double prescale, double postscale, int root, DoneCallback done) {
  if (name.empty()) {
    return Status::Error(StatusCode::kInvalidArgument, "a collective needs a non-empty name");
  }
  if (tensors.empty()) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "collective '" + name + "' was given no tensors");
  }
  auto pending = std::make_unique<PendingOp>();
  Request& r = pending->request;
  r.name = name;
  r.op_type = type;
  r.reduce_op = op;
  r.prescale = prescale;
  r.postscale = postscale;
  r.root_rank = root;
  for (const TensorRef& t : tensors) {
    r.dtypes.push_back(t.dtype);
    r.shapes.push_back(t.shape);
  }
  pending->tensors = std::move(tensors);
  pending->done = std::move(done);
  return Engine::Instance().Enqueue(std::move(pending));
}

}  // namespace

Status EnqueueAllreduce(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                        double prescale, double postscale, DoneCallback done) {
  for (const TensorRef& t : tensors) {
    if (t.dtype != tensors[0].dtype) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "grouped allreduce '" + name + "' mixes dtypes " +
                               DataTypeName(tensors[0].dtype) + " and " + DataTypeName(t.dtype) +
                               "; submit one group per dtype");
    }
    if (t.dtype == DataType::kBool || static_cast<int32_t>(t.dtype) > 8) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "allreduce '" + name + "' does not support " + DataTypeName(t.dtype) +
                               " tensors");
    }
  }
  if (!IsValidReduceOp(static_cast<int32_t>(op))) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "allreduce '" + name + "' got an unknown reduction op " +
                             std::to_string(static_cast<int>(op)));
  }
  return Submit(name, OpType::kAllreduce, std::move(tensors), op, prescale, postscale, 0,
                std::move(done));
}

Status EnqueueBroadcast(const std::string& name, std::vector<TensorRef> tensors, int root_rank,
                        DoneCallback done) {
  return Submit(name, OpType::kBroadcast, std::move(tensors), ReduceOp::kSum, 1.0, 1.0,
                root_rank, std::move(done));
}

bool EngineRunning() { return Engine::Instance().running(); }

}  // namespace hvdkeras

// Builds requests from framework submissions and hands them to the engine.
#include "core/engine_api.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/collectives.h"
#include "core/device.h"
#include "core/engine.h"

namespace hvdkeras {

namespace {

Status Invalid(const std::string& message) {
  return Status::Error(StatusCode::kInvalidArgument, message);
}

// Sets every field a submission decides, so that a recycled op (Note
// [recycled ops] in pending_op.h) carries nothing over from its last use.
void FillOp(PendingOp* op, const std::string& name, OpType type, DoneCallback done) {
  Request& r = op->request;
  r.name = name;
  r.op_type = type;
  r.reduce_op = ReduceOp::kSum;
  r.prescale = 1.0;
  r.postscale = 1.0;
  r.root_rank = 0;
  r.device = DeviceKind::kCpu;
  r.priority = 0;
  r.dtypes.clear();
  r.shapes.resize(op->tensors.size());  // keeps the shapes' storage
  for (size_t i = 0; i < op->tensors.size(); ++i) {
    r.dtypes.push_back(op->tensors[i].dtype);
    r.shapes[i].assign(op->tensors[i].shape.begin(), op->tensors[i].shape.end());
  }
  op->done = std::move(done);
}

// An emptied op of the process set's engine, or a new one.
std::unique_ptr<PendingOp> SpareOp(int process_set) {
  Engine* engine = Engine::ForSet(process_set);
  std::unique_ptr<PendingOp> op = engine ? engine->TakeSpareOp() : nullptr;
  return op ? std::move(op) : std::make_unique<PendingOp>();
}

std::unique_ptr<PendingOp> MakeOp(int process_set, const std::string& name, OpType type,
                                  std::vector<TensorRef> tensors, DoneCallback done) {
  std::unique_ptr<PendingOp> op = SpareOp(process_set);
  op->tensors = std::move(tensors);
  FillOp(op.get(), name, type, std::move(done));
  return op;
}

// Where the op's tensors live; for GPU tensors, records on each framework
// stream that the inputs are ready (see Note [stream order] in device.h).
Status PrepareDevice(PendingOp* op) {
  Request& r = op->request;
  int gpus = 0;
  for (const TensorRef& t : op->tensors) gpus += t.device >= 0 ? 1 : 0;
  if (gpus == 0) return Status::OK();
  if (gpus != static_cast<int>(op->tensors.size())) {
    return Invalid(std::string(OpTypeName(r.op_type)) + " '" + r.name +
                   "' mixes tensors in host and GPU memory; submit them separately");
  }
  r.device = DeviceKind::kGpu;
  const DeviceBackend* backend = GetDeviceBackend();
  std::string why;
  Device* device = backend ? backend->device(&why) : nullptr;
  if (device == nullptr) {
    return Status::Error(StatusCode::kPreconditionError,
                         "GPU tensor for collective '" + r.name + "', but " +
                             (backend ? "no GPU is usable: " + why
                                      : std::string(kNoGpuPart)));
  }
  // One ready event per framework stream and GPU, not per tensor: the
  // engine stream waits for the first tensor's event of each stream, which
  // covers every tensor queued on it before (a step's gradients arrive on
  // one stream, so this is one event per op instead of hundreds).
  std::vector<std::pair<int, void*>> recorded;  // (GPU, stream): one or two per op
  for (TensorRef& t : op->tensors) {
    NoteDeviceUsed(t.device);
    const std::pair<int, void*> place{t.device, t.framework_stream};
    if (std::find(recorded.begin(), recorded.end(), place) != recorded.end()) continue;
    recorded.push_back(place);
    Status s = device->RecordReady(t.device, t.framework_stream, &t.ready);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status NotAMember(OpType type, const std::string& name, int process_set) {
  return Status::Error(StatusCode::kPreconditionError,
                       std::string(OpTypeName(type)) + " '" + name + "' names process set " +
                           std::to_string(process_set) +
                           ", which this rank is not a member of (or which was removed)");
}

Status Queue(std::unique_ptr<PendingOp> op, int process_set) {
  Engine* engine = Engine::ForSet(process_set);
  if (engine == nullptr) return NotAMember(op->request.op_type, op->request.name, process_set);
  Status s = PrepareDevice(op.get());
  if (s.ok()) s = engine->Enqueue(std::move(op));
  if (!s.ok()) DiscardReadyEvents(op.get());  // a refused op stays ours
  return s;
}

// Whether `dtype` can be reduced with `op`, for the collective `name`.
Status CheckReduction(const char* what, const std::string& name, DataType dtype, ReduceOp op) {
  if (!IsReducible(dtype)) {
    return Invalid(std::string(what) + " '" + name + "' does not support " +
                   DataTypeName(dtype) + " tensors");
  }
  if (!IsValidReduceOp(static_cast<int32_t>(op))) {
    return Invalid(std::string(what) + " '" + name + "' got an unknown reduction op " +
                   std::to_string(static_cast<int>(op)));
  }
  return Status::OK();
}

// Checks shared by the reducing ops: a name, tensors, one reducible dtype.
Status CheckReducible(const char* what, const std::string& name,
                      const std::vector<TensorRef>& tensors, ReduceOp op) {
  if (name.empty()) return Invalid(std::string(what) + " needs a non-empty name");
  if (tensors.empty()) return Invalid(std::string(what) + " '" + name + "' was given no tensors");
  for (const TensorRef& t : tensors) {
    if (t.dtype != tensors[0].dtype) {
      return Invalid(std::string(what) + " '" + name + "' mixes dtypes " +
                     DataTypeName(tensors[0].dtype) + " and " + DataTypeName(t.dtype) +
                     "; submit one group per dtype");
    }
  }
  return CheckReduction(what, name, tensors[0].dtype, op);
}

Status CheckNamed(const char* what, const std::string& name,
                  const std::vector<TensorRef>& tensors) {
  if (name.empty()) return Invalid(std::string(what) + " needs a non-empty name");
  if (tensors.empty()) return Invalid(std::string(what) + " '" + name + "' was given no tensors");
  return Status::OK();
}

}  // namespace

Status EnqueueAllreduce(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                        double prescale, double postscale, int process_set,
                        DoneCallback done, int priority) {
  Status s = CheckReducible("allreduce", name, tensors, op);
  if (!s.ok()) return s;
  if (priority < 0) {
    return Invalid("allreduce '" + name + "' was given priority " + std::to_string(priority) +
                   "; priorities are 0 (run when agreed) or above (run in their order)");
  }
  auto pending = MakeOp(process_set, name, OpType::kAllreduce, std::move(tensors), std::move(done));
  pending->request.priority = priority;
  pending->request.reduce_op = op;
  pending->request.prescale = prescale;
  pending->request.postscale = postscale;
  return Queue(std::move(pending), process_set);
}

void NoteFrameworkWait(int process_set, const std::string& name,
                       std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end) {
  Engine* engine = Engine::ForSet(process_set);
  if (engine != nullptr) engine->NoteFrameworkWait(name, start, end);
}

Status EnqueueAllreduceEach(const std::vector<std::string>& names,
                            std::vector<TensorRef> tensors, ReduceOp op, double prescale,
                            double postscale, int process_set, const DoneCallback& done) {
  if (names.size() != tensors.size()) {
    return Invalid("allreduce of separate tensors needs one name per tensor, got " +
                   std::to_string(names.size()) + " names for " +
                   std::to_string(tensors.size()) + " tensors");
  }
  if (tensors.empty()) return Invalid("allreduce of separate tensors was given no tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (names[i].empty()) return Invalid("allreduce needs a non-empty name");
    Status s = CheckReduction("allreduce", names[i], tensors[i].dtype, op);
    if (!s.ok()) return s;
  }
  Engine* engine = Engine::ForSet(process_set);
  if (engine == nullptr) return NotAMember(OpType::kAllreduce, names[0], process_set);
  std::vector<std::unique_ptr<PendingOp>> ops;
  ops.reserve(tensors.size());
  engine->TakeSpareOps(tensors.size(), &ops);
  while (ops.size() < tensors.size()) ops.push_back(std::make_unique<PendingOp>());
  for (size_t i = 0; i < tensors.size(); ++i) {
    PendingOp* pending = ops[i].get();
    pending->tensors.resize(1);
    pending->tensors[0] = std::move(tensors[i]);
    FillOp(pending, names[i], OpType::kAllreduce, done);
    pending->request.reduce_op = op;
    pending->request.prescale = prescale;
    pending->request.postscale = postscale;
    Status s = PrepareDevice(pending);
    if (!s.ok()) {
      for (size_t j = 0; j <= i; ++j) DiscardReadyEvents(ops[j].get());
      return s;
    }
  }
  Status s = engine->EnqueueAll(&ops);
  if (!s.ok()) {
    for (auto& pending : ops) DiscardReadyEvents(pending.get());
  }
  return s;
}

Status EnqueueBroadcast(const std::string& name, std::vector<TensorRef> tensors, int root_rank,
                        int process_set, DoneCallback done) {
  Status s = CheckNamed("broadcast", name, tensors);
  if (!s.ok()) return s;
  auto pending = MakeOp(process_set, name, OpType::kBroadcast, std::move(tensors), std::move(done));
  pending->request.root_rank = root_rank;
  return Queue(std::move(pending), process_set);
}

Status EnqueueAllgather(const std::string& name, std::vector<TensorRef> tensors,
                        int process_set, DoneCallback done) {
  Status s = CheckNamed("allgather", name, tensors);
  if (!s.ok()) return s;
  return Queue(MakeOp(process_set, name, OpType::kAllgather, std::move(tensors), std::move(done)),
               process_set);
}

Status EnqueueAlltoall(const std::string& name, TensorRef tensor, std::vector<int64_t> splits,
                       int process_set, DoneCallback done) {
  if (name.empty()) return Invalid("alltoall needs a non-empty name");
  std::vector<TensorRef> tensors;
  tensors.push_back(std::move(tensor));
  auto pending = MakeOp(process_set, name, OpType::kAlltoall, std::move(tensors), std::move(done));
  pending->request.splits = std::move(splits);
  return Queue(std::move(pending), process_set);
}

Status EnqueueReducescatter(const std::string& name, std::vector<TensorRef> tensors, ReduceOp op,
                            double prescale, double postscale, int process_set,
                            DoneCallback done) {
  Status s = CheckReducible("reducescatter", name, tensors, op);
  if (!s.ok()) return s;
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage) {
    return Invalid("reducescatter '" + name + "' supports only Sum and Average, not " +
                   ReduceOpName(op));
  }
  // A GPU output's shape is known now (this rank's rows), so it is
  // allocated here, on the framework's thread, as allreduce's are: the
  // engine then writes it without first waiting for everything the
  // framework queued on its stream since (Note [stream order] in device.h).
  Engine* engine = Engine::ForSet(process_set);
  if (engine == nullptr) return NotAMember(OpType::kReducescatter, name, process_set);
  for (TensorRef& t : tensors) {
    // (A stopped engine refuses the op in Queue, with the reason.)
    if (!engine->running()) break;
    if (t.device < 0 || t.output != nullptr || !t.allocate_output || t.shape.empty()) continue;
    Shape own = t.shape;
    own[0] = ScatterRows(t.shape[0], engine->size(), engine->rank());
    s = t.allocate_output(own, &t.output);
    if (!s.ok()) return s;
    if (t.output == nullptr && NumElements(own) > 0) {
      return Invalid("reducescatter '" + name + "': the framework gave no output buffer");
    }
  }
  auto pending =
      MakeOp(process_set, name, OpType::kReducescatter, std::move(tensors), std::move(done));
  pending->request.reduce_op = op;
  pending->request.prescale = prescale;
  pending->request.postscale = postscale;
  return Queue(std::move(pending), process_set);
}

Status EnqueueBarrier(const std::string& name, int process_set, DoneCallback done) {
  if (name.empty()) return Invalid("barrier needs a non-empty name");
  return Queue(MakeOp(process_set, name, OpType::kBarrier, {}, std::move(done)), process_set);
}

Status EnqueueJoin(const std::string& name, int32_t* last_joined_rank, DoneCallback done) {
  if (name.empty()) return Invalid("join needs a non-empty name");
  auto pending = MakeOp(/*process_set=*/0, name, OpType::kJoin, {}, std::move(done));
  pending->join_result = last_joined_rank;
  return Queue(std::move(pending), /*process_set=*/0);
}

bool EngineRunning() { return Engine::Instance().running(); }

Status PointerDevice(const void* data, int* device) {
  const DeviceBackend* backend = GetDeviceBackend();
  std::string why;
  Device* gpu = backend ? backend->device(&why) : nullptr;
  if (gpu == nullptr) {
    return Status::Error(StatusCode::kPreconditionError,
                         std::string("GPU buffers were handed to hvdkeras, but ") +
                             (backend ? "no GPU is usable: " + why : std::string(kNoGpuPart)));
  }
  return gpu->PointerDevice(data, device);
}

}  // namespace hvdkeras

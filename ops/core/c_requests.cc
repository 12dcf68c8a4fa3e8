// C entry points through which a binding that is not a TensorFlow kernel
// (PyTorch's custom ops, JAX's, NumPy arrays) hands the engine collectives
// over host buffers: submit a request, wait for it with a bound, read the
// outputs whose shape negotiation decided, release it.
//
// Note [request lifetime]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A request's input and caller-provided output buffers belong to the
// caller and must stay valid until the engine calls `done`, which may be
// after a bounded wait gave up: a caller that stops waiting keeps its
// buffers (the engine's stall bound ends the job if the op never finishes).
// Outputs whose shape only negotiation knows (allgather, alltoall,
// reducescatter) are allocated here and copied out by
// hvdkeras_request_output; the request owns them until released.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/engine_api.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::ReduceOp;
using hvdkeras::Shape;
using hvdkeras::Status;
using hvdkeras::TensorRef;

struct Request {
  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  Status status;
  std::vector<Shape> output_shapes;
  // Engine-shaped outputs only. Left uninitialised (the collective writes
  // every byte before anyone reads): zeroing one costs a pass over memory the
  // exchange is about to write, tens of milliseconds for 100 MB.
  struct Output {
    std::unique_ptr<char[]> data;
    int64_t bytes = 0;
  };
  std::vector<Output> outputs;
  std::vector<int64_t> received_splits;
  // Join only: the rank that joined last, written before `done`.
  int32_t last_joined_rank = -1;
};

std::mutex registry_mutex;
std::map<int64_t, std::shared_ptr<Request>> registry;
int64_t next_id = 1;

std::shared_ptr<Request> Find(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(id);
  return it == registry.end() ? nullptr : it->second;
}

// Builds the tensors of one request. `dims` holds every tensor's dimensions
// one after another; `ranks[i]` says how many belong to tensor i.
std::vector<TensorRef> Tensors(int count, const void* const* inputs, void* const* outputs,
                               const int* ranks, const int64_t* dims, DataType dtype,
                               bool engine_shaped, int device, void* stream,
                               const std::shared_ptr<Request>& request) {
  std::vector<TensorRef> tensors(count);
  request->output_shapes.resize(count);
  if (engine_shaped) request->outputs.resize(count);
  size_t at = 0;
  for (int i = 0; i < count; ++i) {
    TensorRef& t = tensors[i];
    t.input = inputs[i];
    t.dtype = dtype;
    t.device = device;
    t.framework_stream = device >= 0 ? stream : nullptr;
    t.shape.assign(dims + at, dims + at + ranks[i]);
    at += ranks[i];
    request->output_shapes[i] = t.shape;
    if (engine_shaped) {
      std::weak_ptr<Request> weak = request;
      t.allocate_output = [weak, i, dtype](const Shape& shape, void** data) {
        auto r = weak.lock();
        if (!r) return Status::Error(hvdkeras::StatusCode::kAborted, "request released");
        r->output_shapes[i] = shape;
        const int64_t bytes = hvdkeras::NumElements(shape) * hvdkeras::DataTypeSize(dtype);
        r->outputs[i].data.reset(new char[bytes + 1]);  // + 1: a valid address when empty
        r->outputs[i].bytes = bytes;
        *data = r->outputs[i].data.get();
        return Status::OK();
      };
    } else {
      t.output = outputs[i];
    }
  }
  return tensors;
}

}  // namespace

using hvdkeras::CopyText;

extern "C" {

// Submits one collective (`kind_number`: an OpType of core/common.h) over
// `count` tensors of element type `dtype` (the engine's numbering, see
// hvdkeras_vocabulary), in host memory (`device` -1) or on GPU `device`,
// ordered after the work queued on the framework's CUDA `stream` (Note
// [stream order] in device.h; the request finishes once that stream waits
// for the results). Allreduce and broadcast write into `outputs` (which may
// equal `inputs`), and so do a reducescatter and an allgather of GPU
// tensors (the caller allocates their outputs, shaped as the engine will
// agree); the others allocate their outputs in host memory (Note [request
// lifetime]), so alltoall takes no GPU tensors. `splits`
// (alltoall only) holds `count_splits` row counts. Returns the request's id
// (> 0), or 0 with a message in `error` when the op could not be queued.
int64_t hvdkeras_request_submit(int kind_number, const char* name, int count,
                                const void* const* inputs, void* const* outputs,
                                const int* ranks, const int64_t* dims, int dtype,
                                int reduce_op, double prescale, double postscale, int root,
                                const int64_t* splits, int count_splits, int process_set,
                                int device, void* stream, char* error, int capacity) {
  if (!hvdkeras::IsValidDataType(dtype) || !hvdkeras::IsValidReduceOp(reduce_op)) {
    CopyText("unknown element type or reduction number", error, capacity);
    return 0;
  }
  using hvdkeras::OpType;
  const auto kind = static_cast<OpType>(kind_number);
  auto request = std::make_shared<Request>();
  if (device >= 0 && kind == OpType::kAlltoall) {
    CopyText(std::string(hvdkeras::OpTypeName(kind)) + " '" + (name ? name : "") +
                 "' takes host tensors through this binding; move GPU tensors to the CPU "
                 "for it",
             error, capacity);
    return 0;
  }
  // GPU outputs come from the caller (the engine cannot allocate the
  // framework's GPU memory): a reducescatter's rows, an allgather's total
  // rows agreed beforehand.
  const bool engine_shaped =
      device < 0 && (kind == OpType::kAllgather || kind == OpType::kAlltoall ||
                     kind == OpType::kReducescatter);
  std::vector<TensorRef> tensors =
      Tensors(count, inputs, outputs, ranks, dims, static_cast<DataType>(dtype), engine_shaped,
              device, stream, request);
  if (kind == OpType::kAlltoall && count == 1) {
    std::weak_ptr<Request> weak = request;
    tensors[0].receive_splits = [weak](const std::vector<int64_t>& received) {
      if (auto r = weak.lock()) r->received_splits = received;
    };
  }
  // The callback holds the request, so it outlives a caller that released it.
  hvdkeras::DoneCallback done = [request](const Status& status) {
    std::lock_guard<std::mutex> lock(request->mutex);
    request->status = status;
    request->finished = true;
    request->finished_cv.notify_all();
  };
  const std::string op_name = name ? name : "";
  const auto op = static_cast<ReduceOp>(reduce_op);
  Status s;
  switch (kind) {
    case OpType::kAllreduce:
      s = hvdkeras::EnqueueAllreduce(op_name, std::move(tensors), op, prescale, postscale,
                                     process_set, done);
      break;
    case OpType::kBroadcast:
      s = hvdkeras::EnqueueBroadcast(op_name, std::move(tensors), root, process_set, done);
      break;
    case OpType::kAllgather:
      s = hvdkeras::EnqueueAllgather(op_name, std::move(tensors), process_set, done);
      break;
    case OpType::kAlltoall:
      if (count != 1) {
        s = Status::Error(hvdkeras::StatusCode::kInvalidArgument, "alltoall takes one tensor");
        break;
      }
      s = hvdkeras::EnqueueAlltoall(op_name, tensors[0],
                                    std::vector<int64_t>(splits, splits + count_splits),
                                    process_set, done);
      break;
    case OpType::kReducescatter:
      s = hvdkeras::EnqueueReducescatter(op_name, std::move(tensors), op, prescale, postscale,
                                         process_set, done);
      break;
    case OpType::kBarrier:
      s = hvdkeras::EnqueueBarrier(op_name, process_set, done);
      break;
    case OpType::kJoin:  // global: the engine takes no process set for it
      if (process_set != 0) {
        s = Status::Error(hvdkeras::StatusCode::kInvalidArgument,
                          "join is global: it takes no process set");
        break;
      }
      s = hvdkeras::EnqueueJoin(op_name, &request->last_joined_rank, done);
      break;
    default:
      s = Status::Error(hvdkeras::StatusCode::kInvalidArgument,
                        "unknown request kind " + std::to_string(kind_number));
  }
  if (!s.ok()) {
    CopyText(s.message, error, capacity);
    return 0;
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  const int64_t id = next_id++;
  registry[id] = request;
  return id;
}

// Waits up to `timeout_seconds` for the request. Returns 0 when it
// succeeded, 1 when it failed (message in `error`), 2 when it is still
// running, 3 for an unknown id.
int hvdkeras_request_wait(int64_t id, double timeout_seconds, char* error, int capacity) {
  auto request = Find(id);
  if (!request) return 3;
  std::unique_lock<std::mutex> lock(request->mutex);
  const auto bound = std::chrono::duration<double>(timeout_seconds);
  if (!request->finished_cv.wait_for(lock, bound, [&] { return request->finished; })) return 2;
  if (request->status.ok()) return 0;
  CopyText(request->status.message, error, capacity);
  return 1;
}

// The shape of output `index` of a finished request: writes up to
// `capacity` dimensions into `dims` and returns the rank (-1: no such output).
int hvdkeras_request_shape(int64_t id, int index, int64_t* dims, int capacity) {
  auto request = Find(id);
  if (!request || index < 0 || index >= static_cast<int>(request->output_shapes.size())) {
    return -1;
  }
  const Shape& shape = request->output_shapes[index];
  for (int d = 0; d < static_cast<int>(shape.size()) && d < capacity; ++d) dims[d] = shape[d];
  return static_cast<int>(shape.size());
}

// Copies engine-allocated output `index` into `destination` (sized from
// hvdkeras_request_shape). Returns the bytes copied, or -1.
int64_t hvdkeras_request_output(int64_t id, int index, void* destination) {
  auto request = Find(id);
  if (!request || index < 0 || index >= static_cast<int>(request->outputs.size())) return -1;
  const auto& output = request->outputs[index];
  if (output.bytes > 0) std::memcpy(destination, output.data.get(), output.bytes);
  return output.bytes;
}

// Rows each rank sent to this one in an alltoall; returns how many ranks.
int hvdkeras_request_received_splits(int64_t id, int64_t* out, int capacity) {
  auto request = Find(id);
  if (!request) return -1;
  const auto& received = request->received_splits;
  for (int r = 0; r < static_cast<int>(received.size()) && r < capacity; ++r) out[r] = received[r];
  return static_cast<int>(received.size());
}

// The rank that joined last, for a finished join request; -1 otherwise.
int hvdkeras_request_last_joined_rank(int64_t id) {
  auto request = Find(id);
  if (!request) return -1;
  std::lock_guard<std::mutex> lock(request->mutex);
  return request->finished ? request->last_joined_rank : -1;
}

// Forgets the request (its outputs go when the engine is done with it too).
void hvdkeras_request_release(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(id);
}

}  // extern "C"

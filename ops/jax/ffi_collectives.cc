// The JAX binding: hvdkeras's collectives as one XLA FFI handler for the
// CPU platform, called through `jax.ffi.ffi_call` inside `jax.jit`
// (hvdkeras/backends/jax/ops.py). Built apart from the TensorFlow op library,
// against jaxlib's FFI headers, and linked to the engine library (Note [one
// engine, many bindings] in hvdkeras/engine/toolchain.py).
//
// Note [asynchronous jax collectives]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The handler queues the collective and returns a future at once instead
// of blocking the XLA thread that called it: XLA's CPU runtime treats the
// call as one of its own asynchronous thunks and may run work that does not
// depend on it meanwhile. The calls are side-effecting (never dropped), and
// XLA runs side-effecting calls in program order, so within one compiled
// step the ranks must reach their collectives in the same order (the same
// traced program on every rank gives that; a rank that differs stalls, and
// the engine's stall bound ends it with the collective's name, as under
// TensorFlow's XLA). The engine completes the future from its own thread,
// which must not run XLA's continuation (the rest of the step) there, so
// completions are handed to a thread of this binding.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/engine_api.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Runs completions off the engine's thread (Note [asynchronous jax collectives]).
class Completions {
 public:
  static Completions& Instance() {
    // Never destroyed: its detached thread may run until the process ends.
    static Completions* instance = new Completions();
    return *instance;
  }

  void Post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    ready_.notify_one();
  }

 private:
  Completions() : thread_([this] { Loop(); }) { thread_.detach(); }

  void Loop() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
};

hvdkeras::Shape ShapeOf(const ffi::AnyBuffer& buffer) {
  auto dims = buffer.dimensions();
  return hvdkeras::Shape(dims.begin(), dims.end());
}

ffi::Future Failed(const std::string& message) {
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, message));
  return future;
}

// The last `after` arguments are never read: they are an earlier
// collective's output, passed only so that XLA runs this call after it
// (Note [collectives in call order] in hvdkeras/backends/jax/ops.py).
ffi::Future Collective(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                       int32_t kind_number, int32_t dtype, int32_t reduce_op, double prescale,
                       double postscale, int32_t root, int32_t process_set, int32_t parts,
                       int32_t after) {
  using hvdkeras::OpType;
  const auto kind = static_cast<OpType>(kind_number);  // the numbering of core/common.h
  if (after < 0 || static_cast<size_t>(after) > args.size() ||
      args.size() - static_cast<size_t>(after) != rets.size()) {
    return Failed("hvdkeras: one output per input expected");
  }
  std::vector<hvdkeras::TensorRef> tensors(rets.size());
  for (size_t i = 0; i < rets.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value()) return Failed("hvdkeras: bad buffer");
    hvdkeras::TensorRef& t = tensors[i];
    t.input = in->untyped_data();
    t.shape = ShapeOf(*in);
    t.dtype = static_cast<hvdkeras::DataType>(dtype);
    void* output = (*out)->untyped_data();
    const hvdkeras::Shape planned = ShapeOf(**out);
    if (kind == OpType::kAllreduce || kind == OpType::kBroadcast) {
      t.output = output;
    } else {
      // XLA shaped the output when it compiled the step: the engine's shape
      // must be that one (equal rows on every rank, as jit assumes).
      const std::string op_name(name);
      t.allocate_output = [output, planned, op_name](const hvdkeras::Shape& shape,
                                                      void** data) {
        if (shape != planned) {
          return hvdkeras::Status::Error(
              hvdkeras::StatusCode::kInvalidArgument,
              "hvdkeras collective '" + op_name + "' under jax.jit produced shape " +
                  hvdkeras::ShapeString(shape) + " where the compiled step planned " +
                  hvdkeras::ShapeString(planned) +
                  ": every rank must pass the same rows (or equal splits) inside jit");
        }
        *data = output;
        return hvdkeras::Status::OK();
      };
    }
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  hvdkeras::DoneCallback done = [promise](const hvdkeras::Status& status) mutable {
    Completions::Instance().Post([promise, status]() mutable {
      if (status.ok()) {
        promise.SetAvailable();
      } else {
        promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, status.message));
      }
    });
  };
  const std::string op_name(name);
  const auto op = static_cast<hvdkeras::ReduceOp>(reduce_op);
  hvdkeras::Status queued;
  switch (kind) {
    case OpType::kAllreduce:
      queued = hvdkeras::EnqueueAllreduce(op_name, std::move(tensors), op, prescale, postscale,
                                          process_set, done);
      break;
    case OpType::kBroadcast:
      queued = hvdkeras::EnqueueBroadcast(op_name, std::move(tensors), root, process_set, done);
      break;
    case OpType::kAllgather:
      queued = hvdkeras::EnqueueAllgather(op_name, std::move(tensors), process_set, done);
      break;
    case OpType::kAlltoall: {
      // Inside jit only equal parts: every rank sends rows / parts to each
      // rank of the set, so what it receives has the shape XLA planned
      // (Python checked that the rows divide).
      const hvdkeras::Shape shape = tensors.size() == 1 ? tensors.front().shape : hvdkeras::Shape{};
      if (parts <= 0 || shape.empty() || shape[0] % parts != 0) {
        return Failed("hvdkeras alltoall '" + op_name +
                      "': inside jit it takes one tensor whose rows split evenly over the set");
      }
      std::vector<int64_t> splits(static_cast<size_t>(parts), shape[0] / parts);
      queued = hvdkeras::EnqueueAlltoall(op_name, std::move(tensors.front()), std::move(splits),
                                         process_set, done);
      break;
    }
    case OpType::kReducescatter:
      queued = hvdkeras::EnqueueReducescatter(op_name, std::move(tensors), op, prescale,
                                              postscale, process_set, done);
      break;
    default:
      return Failed("hvdkeras: unknown collective kind " + std::to_string(kind_number));
  }
  if (!queued.ok()) return Failed("hvdkeras collective '" + op_name + "': " + queued.message);
  return future;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HvdkerasJaxCollective, Collective,
                              ffi::Ffi::Bind()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<std::string_view>("name")
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("dtype")
                                  .Attr<int32_t>("reduce_op")
                                  .Attr<double>("prescale")
                                  .Attr<double>("postscale")
                                  .Attr<int32_t>("root")
                                  .Attr<int32_t>("process_set")
                                  .Attr<int32_t>("parts")
                                  .Attr<int32_t>("after"));

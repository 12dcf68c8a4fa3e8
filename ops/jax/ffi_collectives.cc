// The JAX binding: hvdkeras's collectives as XLA FFI handlers for the CPU
// platform and the CUDA one, called through `jax.ffi.ffi_call` inside `jax.jit`
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
#include <future>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
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

// What one call asked for (the handlers' attributes).
struct Call {
  std::string name;
  int32_t kind, dtype, reduce_op;
  double prescale, postscale;
  int32_t root, process_set, parts, after;
};

// The engine's view of the call's buffers (host memory, or GPU `device`'s
// written on XLA's `stream`), or an error message. The last `after`
// arguments are never read: they are an earlier collective's output, passed
// only so that XLA runs this call after it (Note [collectives in call order]
// in hvdkeras/backends/jax/ops.py).
std::string Tensors(ffi::RemainingArgs& args, ffi::RemainingRets& rets, const Call& call,
                    int device, void* stream, std::vector<hvdkeras::TensorRef>* tensors) {
  using hvdkeras::OpType;
  const auto kind = static_cast<OpType>(call.kind);  // the numbering of core/common.h
  if (call.after < 0 || static_cast<size_t>(call.after) > args.size() ||
      args.size() - static_cast<size_t>(call.after) != rets.size()) {
    return "hvdkeras: one output per input expected";
  }
  tensors->assign(rets.size(), hvdkeras::TensorRef());
  for (size_t i = 0; i < rets.size(); ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!in.has_value() || !out.has_value()) return "hvdkeras: bad buffer";
    hvdkeras::TensorRef& t = (*tensors)[i];
    t.device = device;
    t.framework_stream = stream;
    t.input = in->untyped_data();
    t.shape = ShapeOf(*in);
    t.dtype = static_cast<hvdkeras::DataType>(call.dtype);
    void* output = (*out)->untyped_data();
    const hvdkeras::Shape planned = ShapeOf(**out);
    if (kind == OpType::kAllreduce || kind == OpType::kBroadcast) {
      t.output = output;
    } else {
      // XLA shaped the output when it compiled the step: the engine's shape
      // must be that one (equal rows on every rank, as jit assumes).
      const std::string op_name = call.name;
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
  return "";
}

// Queues the call's collective on `tensors`; `done` gets its outcome.
hvdkeras::Status Enqueue(const Call& call, std::vector<hvdkeras::TensorRef> tensors,
                         hvdkeras::DoneCallback done) {
  using hvdkeras::OpType;
  const auto op = static_cast<hvdkeras::ReduceOp>(call.reduce_op);
  const std::string& op_name = call.name;
  switch (static_cast<OpType>(call.kind)) {
    case OpType::kAllreduce:
      return hvdkeras::EnqueueAllreduce(op_name, std::move(tensors), op, call.prescale,
                                        call.postscale, call.process_set, done);
    case OpType::kBroadcast:
      return hvdkeras::EnqueueBroadcast(op_name, std::move(tensors), call.root,
                                        call.process_set, done);
    case OpType::kAllgather:
      return hvdkeras::EnqueueAllgather(op_name, std::move(tensors), call.process_set, done);
    case OpType::kAlltoall: {
      // Inside jit only equal parts: every rank sends rows / parts to each
      // rank of the set, so what it receives has the shape XLA planned
      // (Python checked that the rows divide).
      const hvdkeras::Shape shape =
          tensors.size() == 1 ? tensors.front().shape : hvdkeras::Shape{};
      if (call.parts <= 0 || shape.empty() || shape[0] % call.parts != 0) {
        return hvdkeras::Status::Error(
            hvdkeras::StatusCode::kInvalidArgument,
            "inside jit alltoall takes one tensor whose rows split evenly over the set");
      }
      std::vector<int64_t> splits(static_cast<size_t>(call.parts), shape[0] / call.parts);
      return hvdkeras::EnqueueAlltoall(op_name, std::move(tensors.front()), std::move(splits),
                                       call.process_set, done);
    }
    case OpType::kReducescatter:
      return hvdkeras::EnqueueReducescatter(op_name, std::move(tensors), op, call.prescale,
                                            call.postscale, call.process_set, done);
    default:
      return hvdkeras::Status::Error(hvdkeras::StatusCode::kInvalidArgument,
                                     "unknown collective kind " + std::to_string(call.kind));
  }
}

ffi::Future Collective(ffi::RemainingArgs args, ffi::RemainingRets rets, std::string_view name,
                       int32_t kind_number, int32_t dtype, int32_t reduce_op, double prescale,
                       double postscale, int32_t root, int32_t process_set, int32_t parts,
                       int32_t after) {
  const Call call{std::string(name), kind_number, dtype, reduce_op, prescale, postscale,
                  root, process_set, parts, after};
  std::vector<hvdkeras::TensorRef> tensors;
  const std::string bad = Tensors(args, rets, call, -1, nullptr, &tensors);
  if (!bad.empty()) return Failed(bad);
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
  const hvdkeras::Status queued = Enqueue(call, std::move(tensors), done);
  if (!queued.ok()) return Failed("hvdkeras collective '" + call.name + "': " + queued.message);
  return future;
}

// The CUDA platform's handler: XLA's device buffers and stream go to the
// engine as GPU tensors produced and consumed on that stream (Note [stream
// order] in core/device.h). It returns once the engine has queued the
// collective and made XLA's stream wait for the results: XLA launches the
// step's later kernels on that stream right after, so they must be ordered
// behind the collective before it goes on; nothing waits for the GPU.
ffi::Error CollectiveOnGpu(void* stream, ffi::RemainingArgs args, ffi::RemainingRets rets,
                           std::string_view name, int32_t kind_number, int32_t dtype,
                           int32_t reduce_op, double prescale, double postscale, int32_t root,
                           int32_t process_set, int32_t parts, int32_t after) {
  const Call call{std::string(name), kind_number, dtype, reduce_op, prescale, postscale,
                  root, process_set, parts, after};
  const void* any = nullptr;
  for (size_t i = 0; i < rets.size() && any == nullptr; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    if (in.has_value() && in->size_bytes() > 0) any = in->untyped_data();
  }
  int device = -1;
  hvdkeras::Status found =
      any == nullptr ? hvdkeras::Status::Error(hvdkeras::StatusCode::kInvalidArgument,
                                               "every input is empty; leave such collectives "
                                               "out of the compiled step")
                     : hvdkeras::PointerDevice(any, &device);
  std::vector<hvdkeras::TensorRef> tensors;
  std::string bad = found.ok() ? Tensors(args, rets, call, device, stream, &tensors)
                               : found.message;
  if (bad.empty()) {
    std::promise<hvdkeras::Status> finished;
    std::future<hvdkeras::Status> result = finished.get_future();
    const hvdkeras::Status queued = Enqueue(
        call, std::move(tensors), [&finished](const hvdkeras::Status& s) { finished.set_value(s); });
    const hvdkeras::Status outcome = queued.ok() ? result.get() : queued;
    bad = outcome.message;
  }
  if (bad.empty()) return ffi::Error::Success();
  return ffi::Error(ffi::ErrorCode::kInternal, "hvdkeras collective '" + call.name + "': " + bad);
}

}  // namespace

// The arguments and attributes both handlers take, after the CUDA one's
// stream: what `_call` in hvdkeras/backends/jax/ops.py passes.
template <typename Binding>
auto CallBinding(Binding binding) {
  return std::move(binding)
      .RemainingArgs()
      .RemainingRets()
      .template Attr<std::string_view>("name")
      .template Attr<int32_t>("kind")
      .template Attr<int32_t>("dtype")
      .template Attr<int32_t>("reduce_op")
      .template Attr<double>("prescale")
      .template Attr<double>("postscale")
      .template Attr<int32_t>("root")
      .template Attr<int32_t>("process_set")
      .template Attr<int32_t>("parts")
      .template Attr<int32_t>("after");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(HvdkerasJaxCollectiveCuda, CollectiveOnGpu,
                              CallBinding(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HvdkerasJaxCollective, Collective, CallBinding(ffi::Ffi::Bind()));

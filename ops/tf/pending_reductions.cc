// An allreduce split in two ops, so that it can start in one TensorFlow call
// and be finished in a later one.
//
// Note [pending reductions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// HvdkerasAllreduceStart hands its tensors to the engine and returns at once
// with a handle (an int64 naming the reduction in this process); the engine
// reduces them in the background. HvdkerasAllreduceDone takes the handle and
// finishes when the reduction has, with its results as outputs. The two may
// sit in different graphs and different calls: a step starts the reductions
// of its last gradients and returns, and the next step's forward pass waits
// for each result just before it reads the variable the result updates
// (Note [cross-step updates] in hvdkeras/training/cross_step.py). Between the
// two, the registry below owns the inputs (the engine reads them) and the
// outputs. A handle is finished once: a second Done, or a Done with a handle
// this process never started, fails naming the handle. Start is a collective
// (negotiated like every allreduce, so every rank must start the same
// reductions in the same names); Done is local and never talks to other
// ranks. The engine finishes every queued reduction, with an error if it
// stops first, so a Done never waits for a reduction the engine has dropped.
// CPU tensors only: a GPU step keeps the synchronous allreduce. When rank 0
// traces, each Done's wait (from its call to its result) goes on the
// timeline under the reduction's name, so a step's picture shows where the
// next forward pass met each bucket (hvdkeras/report/step_picture.py).
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/engine_api.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/completion_batches.h"
#include "tf/engine_buffer.h"
#include "tf/reduction_attrs.h"
#include "tf/status_mapping.h"
#include "tf/type_mapping.h"

namespace tf = tensorflow;

namespace hvdkeras {
namespace {

// One started reduction. `mu` guards everything below it.
struct PendingReduction {
  std::vector<tf::Tensor> inputs;  // kept alive while the engine reads them
  std::mutex mu;
  std::vector<tf::Tensor> outputs;
  bool finished = false;
  Status status = Status::OK();
  // Set by a Done that arrived first; run once the engine finishes.
  std::function<void()> waiter;
  // For the timeline's wait spans (Engine::NoteFrameworkWait).
  std::string name;
  int process_set = 0;
};

class PendingRegistry {
 public:
  static PendingRegistry& Get() {
    static PendingRegistry* registry = new PendingRegistry();  // never destroyed: see Start
    return *registry;
  }

  int64_t Add(std::shared_ptr<PendingReduction> pending) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t handle = next_++;
    table_.emplace(handle, std::move(pending));
    return handle;
  }

  void Remove(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    table_.erase(handle);
  }

  // The reduction under `handle`, taken out of the table; null if none.
  std::shared_ptr<PendingReduction> Take(int64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find(handle);
    if (it == table_.end()) return nullptr;
    std::shared_ptr<PendingReduction> pending = std::move(it->second);
    table_.erase(it);
    return pending;
  }

 private:
  std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<PendingReduction>> table_;
  int64_t next_ = 1;
};

class AllreduceStartKernel : public tf::OpKernel {
 public:
  explicit AllreduceStartKernel(tf::OpKernelConstruction* c) : tf::OpKernel(c) {
    OP_REQUIRES_OK(c, ReadReductionAttrs(c, &reduction_));
    OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_));
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    OP_REQUIRES_OK(c, c->GetAttr("priority", &priority_));
    if (tensor_name_.empty()) tensor_name_ = name();
  }

  // Only queues; never waits.
  bool IsExpensive() override { return false; }

  void Compute(tf::OpKernelContext* ctx) override {
    auto pending = std::make_shared<PendingReduction>();
    pending->name = tensor_name_;
    pending->process_set = process_set_;
    const int n = ctx->num_inputs();
    pending->inputs.reserve(n);
    pending->outputs.resize(n);
    std::vector<TensorRef> refs(n);
    for (int i = 0; i < n; ++i) {
      const tf::Tensor& input = ctx->input(i);
      pending->inputs.push_back(input);
      TensorRef& ref = refs[i];
      OP_REQUIRES(ctx, ToEngineType(input.dtype(), &ref.dtype),
                  absl::InvalidArgumentError("hvdkeras: unsupported dtype " +
                                             tf::DataTypeString(input.dtype())));
      ref.input = input.tensor_data().data();
      for (int d = 0; d < input.dims(); ++d) ref.shape.push_back(input.dim_size(d));
      // The callbacks hold a bare pointer: the reduction outlives the engine's
      // use of its tensors (the engine finishes before `finish` below runs).
      PendingReduction* raw = pending.get();
      ref.allocate_output = [raw, i](const Shape&, void** data) {
        const tf::Tensor& in = raw->inputs[i];
        raw->outputs[i] = tf::Tensor(tf::cpu_allocator(), in.dtype(), in.shape());
        *data = const_cast<char*>(raw->outputs[i].tensor_data().data());
        return Status::OK();
      };
      ref.adopt_output = [raw, i](std::shared_ptr<char> owner, void* data) {
        const tf::Tensor& in = raw->inputs[i];
        tf::core::RefCountPtr<tf::TensorBuffer> buffer(
            new EngineBuffer(std::move(owner), data, in.TotalBytes()));
        raw->outputs[i] = tf::Tensor(in.dtype(), in.shape(), std::move(buffer));
        return Status::OK();
      };
    }
    tf::Tensor* handle_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &handle_out));
    PendingRegistry& registry = PendingRegistry::Get();
    const int64_t handle = registry.Add(pending);
    // The registry (or the Done that took the reduction) keeps it alive
    // until `finish` has run.
    std::shared_ptr<PendingReduction> keep = pending;
    DoneCallback finish = [keep](const Status& status) {
      std::function<void()> waiter;
      {
        std::lock_guard<std::mutex> lock(keep->mu);
        keep->finished = true;
        keep->status = status;
        keep->inputs.clear();
        waiter = std::move(keep->waiter);
      }
      if (waiter) waiter();
    };
    const Status queued =
        EnqueueAllreduce(tensor_name_, std::move(refs), reduction_.op, reduction_.prescale,
                         reduction_.postscale, process_set_, std::move(finish), priority_);
    if (!queued.ok()) {
      registry.Remove(handle);
      ctx->SetStatus(ToTfStatus(queued));
      return;
    }
    handle_out->scalar<int64_t>()() = handle;
  }

 private:
  ReductionAttrs reduction_;
  int process_set_ = 0;
  int priority_ = 0;
  std::string tensor_name_;
};

class AllreduceDoneKernel : public tf::AsyncOpKernel {
 public:
  explicit AllreduceDoneKernel(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
  }

  bool IsExpensive() override { return false; }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const int64_t handle = ctx->input(0).scalar<int64_t>()();
    std::shared_ptr<PendingReduction> pending = PendingRegistry::Get().Take(handle);
    OP_REQUIRES_ASYNC(
        ctx, pending != nullptr,
        absl::FailedPreconditionError(
            "hvdkeras: no pending reduction with handle " + std::to_string(handle) +
            " in this process: it was finished already, or never started here (each "
            "HvdkerasAllreduceStart is finished by exactly one HvdkerasAllreduceDone)"),
        done);
    const auto called = std::chrono::steady_clock::now();
    auto deliver = [this, ctx, pending, called]() {
      NoteFrameworkWait(pending->process_set, pending->name, called,
                        std::chrono::steady_clock::now());
      if (!pending->status.ok()) {
        ctx->SetStatus(ToTfStatus(pending->status));
        return;
      }
      if (static_cast<int>(pending->outputs.size()) != ctx->num_outputs()) {
        ctx->SetStatus(absl::InvalidArgumentError(
            "hvdkeras: the reduction started " + std::to_string(pending->outputs.size()) +
            " tensors, its Done expects " + std::to_string(ctx->num_outputs())));
        return;
      }
      for (int i = 0; i < ctx->num_outputs(); ++i) {
        if (pending->outputs[i].dtype() != dtype_) {
          ctx->SetStatus(absl::InvalidArgumentError(
              "hvdkeras: the reduction's tensors are " +
              tf::DataTypeString(pending->outputs[i].dtype()) + ", its Done expects " +
              tf::DataTypeString(dtype_)));
          return;
        }
        ctx->set_output(i, pending->outputs[i]);
      }
    };
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      if (!pending->finished) {
        // See Note [completions on the framework's pool].
        pending->waiter = [ctx, done, deliver]() mutable {
          deliver();
          FinishKernel(ctx, std::move(done));
        };
        return;
      }
    }
    deliver();
    done();
  }

 private:
  tf::DataType dtype_;
};

}  // namespace
}  // namespace hvdkeras

REGISTER_OP("HvdkerasAllreduceStart")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kReducible))
    .Attr("N: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Attr("priority: int = 0")  // Note [priority on the wire] in core/wire_order.h
    .Input("tensors: N * T")
    .Output("handle: int64")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Starts reducing N tensors across ranks; returns a handle for HvdkerasAllreduceDone.");

REGISTER_OP("HvdkerasAllreduceDone")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kReducible))
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .Input("handle: int64")
    .Output("outputs: N * T")
    .SetIsStateful()  // waits for the engine: never folded, deduplicated or moved
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      std::vector<tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      if (static_cast<int>(shapes.size()) != c->num_outputs()) {
        return absl::InvalidArgumentError("hvdkeras: shapes needs one shape per output");
      }
      for (int i = 0; i < c->num_outputs(); ++i) {
        tensorflow::shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(i, out);
      }
      return absl::OkStatus();
    })
    .Doc("Waits for the reduction a HvdkerasAllreduceStart began; outputs its results.");

REGISTER_KERNEL_BUILDER(Name("HvdkerasAllreduceStart").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AllreduceStartKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasAllreduceDone").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AllreduceDoneKernel);

// The TensorFlow binding's kernels: async op kernels that hand tensors to the
// engine and finish when its callback fires. All policy lives in the engine
// or in Python; this file only translates types and statuses. The ops
// themselves are declared in op_definitions.cc.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/engine_api.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tf/completion_batches.h"
#include "tf/engine_buffer.h"
#include "tf/gpu_placement.h"
#include "tf/reduction_attrs.h"
#include "tf/status_mapping.h"
#include "tf/type_mapping.h"

namespace tf = tensorflow;

namespace hvdkeras {
namespace {

// Fills in what the engine needs to know about input i: dtype, data, shape,
// and its GPU when the kernel runs on one.
absl::Status DescribeInput(tf::OpKernelContext* ctx, int i, TensorRef* ref) {
  const tf::Tensor& input = ctx->input(i);
  if (!ToEngineType(input.dtype(), &ref->dtype)) {
    return absl::InvalidArgumentError("hvdkeras: unsupported dtype " +
                                      tf::DataTypeString(input.dtype()));
  }
  ref->input = input.tensor_data().data();
  ref->shape.reserve(input.dims());
  for (int d = 0; d < input.dims(); ++d) ref->shape.push_back(input.dim_size(d));
  return PlaceOnDevice(ctx, i, ref);
}

// Builds the engine's view of input i, with an output of the same shape that
// reuses the input buffer when TensorFlow allows it.
absl::Status PrepareTensor(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
  const tf::Tensor& input = ctx->input(i);
  tf::Tensor* output = nullptr;
  absl::Status s = ctx->forward_input_or_allocate_output({i}, i, input.shape(), &output);
  if (!s.ok()) return s;
  TensorRef ref;
  absl::Status described = DescribeInput(ctx, i, &ref);
  if (!described.ok()) return described;
  ref.output = const_cast<char*>(output->tensor_data().data());
  refs->push_back(std::move(ref));
  return absl::OkStatus();
}

// Builds the engine's view of input i whose output i is allocated only once
// the engine knows its shape (allgather, alltoall, reducescatter).
absl::Status PrepareLazyTensor(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
  TensorRef ref;
  absl::Status described = DescribeInput(ctx, i, &ref);
  if (!described.ok()) return described;
  ref.allocate_output = [ctx, i](const Shape& shape, void** data) {
    tf::TensorShape tf_shape;
    for (int64_t d : shape) tf_shape.AddDim(d);
    tf::Tensor* output = nullptr;
    absl::Status s = ctx->allocate_output(i, tf_shape, &output);
    if (!s.ok()) return Status::Error(StatusCode::kUnknown, std::string(s.message()));
    *data = const_cast<char*>(output->tensor_data().data());
    return Status::OK();
  };
  refs->push_back(std::move(ref));
  return absl::OkStatus();
}

// Builds the engine's view of allreduce input i. The output is made only
// when the engine knows where the result will be: a slice of its fused
// buffer (adopted, no copy back) or a buffer of our own, which reuses the
// input's when TensorFlow allows it.
absl::Status PrepareAllreduceTensor(tf::OpKernelContext* ctx, int i,
                                    std::vector<TensorRef>* refs) {
  // A GPU result is written into an output allocated now (the engine's
  // fused blocks are host memory).
  if (!InHostMemory(ctx, i)) return PrepareTensor(ctx, i, refs);
  TensorRef ref;
  absl::Status described = DescribeInput(ctx, i, &ref);
  if (!described.ok()) return described;
  ref.allocate_output = [ctx, i](const Shape&, void** data) {
    tf::Tensor* output = nullptr;
    absl::Status s = ctx->forward_input_or_allocate_output({i}, i, ctx->input(i).shape(), &output);
    if (!s.ok()) return Status::Error(StatusCode::kUnknown, std::string(s.message()));
    *data = const_cast<char*>(output->tensor_data().data());
    return Status::OK();
  };
  ref.reuse_input = [ctx, i](void** data) {
    tf::Tensor* output = nullptr;
    if (!ctx->forward_input_to_output_with_shape(i, i, ctx->input(i).shape(), &output)) {
      return false;
    }
    *data = const_cast<char*>(output->tensor_data().data());
    return true;
  };
  ref.adopt_output = [ctx, i](std::shared_ptr<char> owner, void* data) {
    const tf::Tensor& in = ctx->input(i);
    const size_t bytes = in.TotalBytes();
    tf::core::RefCountPtr<tf::TensorBuffer> buffer(
        new EngineBuffer(std::move(owner), data, bytes));
    ctx->set_output(i, tf::Tensor(in.dtype(), in.shape(), std::move(buffer)));
    return Status::OK();
  };
  refs->push_back(std::move(ref));
  return absl::OkStatus();
}

class CollectiveKernel : public tf::AsyncOpKernel {
 public:
  explicit CollectiveKernel(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    // See Note [collective names] in hvdkeras/collectives/common.py.
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    if (tensor_name_.empty()) tensor_name_ = name();
    // Every collective but join names its process set (0: all ranks).
    if (c->HasAttr("process_set_id")) {
      OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_));
    }
  }

  // ComputeAsync only describes the tensors and queues them for the engine;
  // it never waits. Saying so lets TensorFlow run it inline in the thread
  // that made it ready, instead of one thread-pool task per collective
  // (100 separate 40-byte allreduces, 2 ranks on the 2-core dev VM, three
  // alternating runs: 0.78-0.91 ms a step instead of 1.10-1.55 ms).
  bool IsExpensive() override { return false; }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    std::vector<TensorRef> refs;
    refs.reserve(num_data_inputs(ctx));
    for (int i = 0; i < num_data_inputs(ctx); ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, Prepare(ctx, i, &refs), done);
    }
    // See Note [completions on the framework's pool].
    hvdkeras::DoneCallback finish = [ctx, done](const Status& status) mutable {
      if (!status.ok()) ctx->SetStatus(ToTfStatus(status));
      FinishKernel(ctx, std::move(done));
    };
    const Status queued = Submit(ctx, std::move(refs), std::move(finish));
    if (!queued.ok()) {
      ctx->SetStatus(ToTfStatus(queued));
      done();
    }
  }

 protected:
  virtual Status Submit(tf::OpKernelContext* ctx, std::vector<TensorRef> refs,
                        hvdkeras::DoneCallback finish) = 0;
  // How input i and its output are handed to the engine: by default the
  // output is allocated up front with the input's shape.
  virtual absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
    return PrepareTensor(ctx, i, refs);
  }
  // How many leading inputs are data tensors (the rest are parameters).
  virtual int num_data_inputs(tf::OpKernelContext* ctx) const { return ctx->num_inputs(); }
  std::string tensor_name_;
  int process_set_ = 0;
};

class AllreduceKernel : public CollectiveKernel {
 public:
  explicit AllreduceKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    ReductionAttrs attrs;
    OP_REQUIRES_OK(c, ReadReductionAttrs(c, &attrs));
    reduce_op_ = attrs.op;
    prescale_ = attrs.prescale;
    postscale_ = attrs.postscale;
    if (c->HasAttr("tensor_names")) {
      OP_REQUIRES_OK(c, c->GetAttr("tensor_names", &separate_names_));
      int n = 0;
      OP_REQUIRES_OK(c, c->GetAttr("N", &n));
      OP_REQUIRES(c, separate_names_.empty() || static_cast<int>(separate_names_.size()) == n,
                  absl::InvalidArgumentError("hvdkeras: tensor_names needs one name per tensor"));
    }
  }

 protected:
  absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) override {
    return PrepareAllreduceTensor(ctx, i, refs);
  }
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    if (!separate_names_.empty()) return SubmitSeparately(std::move(refs), std::move(finish));
    return EnqueueAllreduce(tensor_name_, std::move(refs), reduce_op_, prescale_, postscale_,
                            process_set_, std::move(finish));
  }
  ReduceOp reduce_op() const { return reduce_op_; }
  double prescale() const { return prescale_; }
  double postscale() const { return postscale_; }

 private:
  // Each tensor as a collective of its own, under its own name (Note
  // [separate allreduces in one kernel]); `finish` runs once, after the last,
  // with the first error any of them had.
  Status SubmitSeparately(std::vector<TensorRef> refs, hvdkeras::DoneCallback finish) {
    // Owned by the ops' callbacks together: the last one deletes it. The
    // callback captures a bare pointer, which std::function keeps inline,
    // so no op allocates a callback (Note [recycled ops] in core/pending_op.h).
    struct Countdown {
      std::mutex mu;
      size_t left;
      Status first_error = Status::OK();
      hvdkeras::DoneCallback finish;
    };
    auto* countdown = new Countdown();
    countdown->left = refs.size();
    countdown->finish = std::move(finish);
    const hvdkeras::DoneCallback one_done = [countdown](const Status& status) {
      Status result = Status::OK();
      {
        std::lock_guard<std::mutex> lock(countdown->mu);
        if (!status.ok() && countdown->first_error.ok()) countdown->first_error = status;
        if (--countdown->left > 0) return;
        result = countdown->first_error;
      }
      hvdkeras::DoneCallback last = std::move(countdown->finish);
      delete countdown;
      last(result);
    };
    const Status queued = EnqueueAllreduceEach(separate_names_, std::move(refs), reduce_op_,
                                               prescale_, postscale_, process_set_, one_done);
    if (!queued.ok()) delete countdown;  // none queued: the caller finishes the kernel
    return queued;
  }

  ReduceOp reduce_op_ = ReduceOp::kSum;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
  std::vector<std::string> separate_names_;
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }

 protected:
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    return EnqueueBroadcast(tensor_name_, std::move(refs), root_rank_, process_set_,
                            std::move(finish));
  }

 private:
  int root_rank_ = 0;
};

class AllgatherKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) override {
    return PrepareLazyTensor(ctx, i, refs);
  }
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    return EnqueueAllgather(tensor_name_, std::move(refs), process_set_, std::move(finish));
  }
};

class ReducescatterKernel : public AllreduceKernel {
 public:
  using AllreduceKernel::AllreduceKernel;

 protected:
  absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) override {
    return PrepareLazyTensor(ctx, i, refs);
  }
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    return EnqueueReducescatter(tensor_name_, std::move(refs), reduce_op(), prescale(),
                                postscale(), process_set_, std::move(finish));
  }
};

class AlltoallKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) override {
    return PrepareLazyTensor(ctx, i, refs);
  }
  int num_data_inputs(tf::OpKernelContext*) const override { return 1; }
  Status Submit(tf::OpKernelContext* ctx, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    const tf::Tensor& splits_tensor = ctx->input(1);
    std::vector<int64_t> splits;
    auto flat = splits_tensor.flat<int64_t>();
    for (int64_t i = 0; i < flat.size(); ++i) splits.push_back(flat(i));
    refs[0].receive_splits = [ctx](const std::vector<int64_t>& received) {
      tf::Tensor* out = nullptr;
      absl::Status s = ctx->allocate_output(
          1, tf::TensorShape({static_cast<int64_t>(received.size())}), &out);
      if (!s.ok()) {
        ctx->SetStatus(s);
        return;
      }
      auto values = out->flat<int64_t>();
      for (size_t i = 0; i < received.size(); ++i) values(i) = received[i];
    };
    return EnqueueAlltoall(tensor_name_, std::move(refs[0]), std::move(splits), process_set_,
                           std::move(finish));
  }
};

class BarrierKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef>,
                hvdkeras::DoneCallback finish) override {
    return EnqueueBarrier(tensor_name_, process_set_, std::move(finish));
  }
};

class JoinKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  Status Submit(tf::OpKernelContext* ctx, std::vector<TensorRef>,
                hvdkeras::DoneCallback finish) override {
    tf::Tensor* out = nullptr;
    absl::Status s = ctx->allocate_output(0, tf::TensorShape({}), &out);
    if (!s.ok()) return Status::Error(StatusCode::kUnknown, std::string(s.message()));
    int32_t* result = out->flat<int32_t>().data();
    *result = -1;
    return EnqueueJoin(tensor_name_, result, std::move(finish));
  }
};

}  // namespace
}  // namespace hvdkeras

REGISTER_KERNEL_BUILDER(Name("HvdkerasAllgather").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasReducescatter").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasAlltoall").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasBarrier").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::BarrierKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasJoin").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::JoinKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasAllreduce").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasBroadcast").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::BroadcastKernel);

#if HVDKERAS_CUDA
// GPU tensors stay on the GPU (the engine runs them through its device
// backend); join and barrier carry no tensors and stay on the CPU.
REGISTER_KERNEL_BUILDER(Name("HvdkerasAllreduce").Device(tensorflow::DEVICE_GPU),
                        hvdkeras::AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasBroadcast").Device(tensorflow::DEVICE_GPU),
                        hvdkeras::BroadcastKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasAllgather").Device(tensorflow::DEVICE_GPU),
                        hvdkeras::AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasReducescatter").Device(tensorflow::DEVICE_GPU),
                        hvdkeras::ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasAlltoall")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("splits")
                            .HostMemory("received_splits"),
                        hvdkeras::AlltoallKernel);
#endif

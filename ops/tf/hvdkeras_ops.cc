// The TensorFlow binding: async op kernels that hand tensors to the engine
// and finish when its callback fires. All policy lives in the engine or in
// Python; this file only translates types and statuses.
#include <string>
#include <vector>

#include "core/engine_api.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf = tensorflow;

namespace hvdkeras {
namespace {

bool ToEngineType(tf::DataType dtype, DataType* out) {
  switch (dtype) {
    case tf::DT_UINT8: *out = DataType::kUInt8; return true;
    case tf::DT_INT8: *out = DataType::kInt8; return true;
    case tf::DT_INT32: *out = DataType::kInt32; return true;
    case tf::DT_INT64: *out = DataType::kInt64; return true;
    case tf::DT_HALF: *out = DataType::kFloat16; return true;
    case tf::DT_BFLOAT16: *out = DataType::kBFloat16; return true;
    case tf::DT_FLOAT: *out = DataType::kFloat32; return true;
    case tf::DT_DOUBLE: *out = DataType::kFloat64; return true;
    case tf::DT_BOOL: *out = DataType::kBool; return true;
    case tf::DT_UINT16: *out = DataType::kUInt16; return true;
    case tf::DT_INT16: *out = DataType::kInt16; return true;
    case tf::DT_UINT32: *out = DataType::kUInt32; return true;
    case tf::DT_UINT64: *out = DataType::kUInt64; return true;
    default: return false;
  }
}

absl::Status ToTfStatus(const Status& s) {
  switch (s.code) {
    case StatusCode::kOk: return absl::OkStatus();
    case StatusCode::kPreconditionError: return absl::FailedPreconditionError(s.message);
    case StatusCode::kInvalidArgument: return absl::InvalidArgumentError(s.message);
    case StatusCode::kAborted: return absl::AbortedError(s.message);
    default: return absl::UnknownError(s.message);
  }
}

// Fills in what the engine needs to know about an input: dtype, data, shape.
absl::Status DescribeInput(const tf::Tensor& input, TensorRef* ref) {
  if (!ToEngineType(input.dtype(), &ref->dtype)) {
    return absl::InvalidArgumentError("hvdkeras: unsupported dtype " +
                                      tf::DataTypeString(input.dtype()));
  }
  ref->input = input.tensor_data().data();
  for (int d = 0; d < input.dims(); ++d) ref->shape.push_back(input.dim_size(d));
  return absl::OkStatus();
}

// Builds the engine's view of input i, with an output of the same shape that
// reuses the input buffer when TensorFlow allows it.
absl::Status PrepareTensor(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
  const tf::Tensor& input = ctx->input(i);
  tf::Tensor* output = nullptr;
  absl::Status s = ctx->forward_input_or_allocate_output({i}, i, input.shape(), &output);
  if (!s.ok()) return s;
  TensorRef ref;
  absl::Status described = DescribeInput(input, &ref);
  if (!described.ok()) return described;
  ref.output = const_cast<char*>(output->tensor_data().data());
  refs->push_back(std::move(ref));
  return absl::OkStatus();
}

// Builds the engine's view of input i whose output i is allocated only once
// the engine knows its shape (allgather, alltoall, reducescatter).
absl::Status PrepareLazyTensor(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
  const tf::Tensor& input = ctx->input(i);
  TensorRef ref;
  absl::Status described = DescribeInput(input, &ref);
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

// Host memory owned by the engine (a slice of its fused buffer), wrapped as a
// TensorFlow buffer; the engine's block lives until the tensor is released.
class EngineBuffer : public tf::TensorBuffer {
 public:
  EngineBuffer(std::shared_ptr<char> owner, void* data, size_t bytes)
      : tf::TensorBuffer(data), owner_(std::move(owner)), bytes_(bytes) {}
  size_t size() const override { return bytes_; }
  tf::TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tf::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocator_name("hvdkeras_fused_output");
  }

 private:
  std::shared_ptr<char> owner_;
  size_t bytes_;
};

// Builds the engine's view of allreduce input i. The output is made only
// when the engine knows where the result will be: a slice of its fused
// buffer (adopted, no copy back) or a buffer of our own, which reuses the
// input's when TensorFlow allows it.
absl::Status PrepareAllreduceTensor(tf::OpKernelContext* ctx, int i,
                                    std::vector<TensorRef>* refs) {
  const tf::Tensor& input = ctx->input(i);
  TensorRef ref;
  absl::Status described = DescribeInput(input, &ref);
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
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    if (tensor_name_.empty()) tensor_name_ = name();
  }

  // ComputeAsync only describes the tensors and queues them for the engine;
  // it never waits. Saying so lets TensorFlow run it inline in the thread
  // that made it ready, instead of one thread-pool task per collective
  // (100 separate 40-byte allreduces, 2 ranks on the 2-core dev VM, three
  // alternating runs: 0.78-0.91 ms a step instead of 1.10-1.55 ms).
  bool IsExpensive() override { return false; }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    std::vector<TensorRef> refs;
    for (int i = 0; i < num_data_inputs(ctx); ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, Prepare(ctx, i, &refs), done);
    }
    hvdkeras::DoneCallback finish = [ctx, done](const Status& status) {
      if (!status.ok()) ctx->SetStatus(ToTfStatus(status));
      done();
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
};

class AllreduceKernel : public CollectiveKernel {
 public:
  explicit AllreduceKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    int reduce_op;
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &reduce_op));
    OP_REQUIRES(c, IsValidReduceOp(reduce_op),
                absl::InvalidArgumentError("hvdkeras: unknown reduce_op " +
                                           std::to_string(reduce_op)));
    reduce_op_ = static_cast<ReduceOp>(reduce_op);
    OP_REQUIRES_OK(c, c->GetAttr("prescale_factor", &prescale_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_factor", &postscale_));
  }

 protected:
  absl::Status Prepare(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) override {
    return PrepareAllreduceTensor(ctx, i, refs);
  }
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    return EnqueueAllreduce(tensor_name_, std::move(refs), reduce_op_, prescale_, postscale_,
                            std::move(finish));
  }
  ReduceOp reduce_op() const { return reduce_op_; }
  double prescale() const { return prescale_; }
  double postscale() const { return postscale_; }

 private:
  ReduceOp reduce_op_ = ReduceOp::kSum;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(tf::OpKernelConstruction* c) : CollectiveKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }

 protected:
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef> refs,
                hvdkeras::DoneCallback finish) override {
    return EnqueueBroadcast(tensor_name_, std::move(refs), root_rank_, std::move(finish));
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
    return EnqueueAllgather(tensor_name_, std::move(refs), std::move(finish));
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
                                postscale(), std::move(finish));
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
    return EnqueueAlltoall(tensor_name_, std::move(refs[0]), std::move(splits), std::move(finish));
  }
};

class BarrierKernel : public CollectiveKernel {
 public:
  using CollectiveKernel::CollectiveKernel;

 protected:
  Status Submit(tf::OpKernelContext*, std::vector<TensorRef>,
                hvdkeras::DoneCallback finish) override {
    return EnqueueBarrier(tensor_name_, std::move(finish));
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

absl::Status PassThroughShapes(tf::shape_inference::InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

}  // namespace
}  // namespace hvdkeras

REGISTER_OP("HvdkerasAllreduce")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double}")
    .Attr("N: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn(hvdkeras::PassThroughShapes)
    .Doc("Reduces N tensors of one dtype across all ranks in one fused call.");

REGISTER_OP("HvdkerasBroadcast")
    .Attr(
        "T: list({uint8, int8, int32, int64, half, bfloat16, float, double, bool, uint16, int16, "
        "uint32, uint64})")
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn(hvdkeras::PassThroughShapes)
    .Doc("Copies tensors from root_rank to every rank.");

// Output shapes with an unknown first dimension (decided by negotiation).
static absl::Status UnknownFirstDim(tf::shape_inference::InferenceContext* c, int num_outputs) {
  for (int i = 0; i < num_outputs; ++i) {
    tf::shape_inference::ShapeHandle out = c->input(i);
    if (c->RankKnown(out) && c->Rank(out) > 0) {
      TF_RETURN_IF_ERROR(c->ReplaceDim(out, 0, c->UnknownDim(), &out));
    }
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

REGISTER_OP("HvdkerasAllgather")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double, bool, uint16, int16, "
          "uint32, uint64}")
    .Attr("N: int >= 1")
    .Attr("tensor_name: string = ''")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      return UnknownFirstDim(c, c->num_inputs());
    })
    .Doc("Concatenates each tensor's rows from every rank, in rank order.");

REGISTER_OP("HvdkerasReducescatter")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double}")
    .Attr("N: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      return UnknownFirstDim(c, c->num_inputs());
    })
    .Doc("Reduces tensors across ranks; each rank keeps its block of rows.");

REGISTER_OP("HvdkerasAlltoall")
    .Attr("T: {uint8, int8, int32, int64, half, bfloat16, float, double, bool, uint16, int16, "
          "uint32, uint64}")
    .Attr("tensor_name: string = ''")
    .Input("tensor: T")
    .Input("splits: int64")
    .Output("output: T")
    .Output("received_splits: int64")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(UnknownFirstDim(c, 1));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Sends splits[r] rows to rank r and concatenates what arrives, in rank order.");

REGISTER_OP("HvdkerasBarrier")
    .Attr("tensor_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::NoOutputs)
    .Doc("Completes once every rank has reached it.");

REGISTER_OP("HvdkerasJoin")
    .Attr("tensor_name: string = ''")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::ScalarShape)
    .Doc("Takes part in other ranks' collectives with neutral values until all ranks join.");

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

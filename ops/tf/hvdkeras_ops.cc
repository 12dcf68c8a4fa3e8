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

// Builds the engine's view of input i, with an output of the same shape that
// reuses the input buffer when TensorFlow allows it.
absl::Status PrepareTensor(tf::OpKernelContext* ctx, int i, std::vector<TensorRef>* refs) {
  const tf::Tensor& input = ctx->input(i);
  tf::Tensor* output = nullptr;
  absl::Status s = ctx->forward_input_or_allocate_output({i}, i, input.shape(), &output);
  if (!s.ok()) return s;
  TensorRef ref;
  if (!ToEngineType(input.dtype(), &ref.dtype)) {
    return absl::InvalidArgumentError("hvdkeras: unsupported dtype " +
                                      tf::DataTypeString(input.dtype()));
  }
  ref.input = input.tensor_data().data();
  ref.output = const_cast<char*>(output->tensor_data().data());
  for (int d = 0; d < input.dims(); ++d) ref.shape.push_back(input.dim_size(d));
  refs->push_back(std::move(ref));
  return absl::OkStatus();
}

class CollectiveKernel : public tf::AsyncOpKernel {
 public:
  explicit CollectiveKernel(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
    if (tensor_name_.empty()) tensor_name_ = name();
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    std::vector<TensorRef> refs;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES_OK_ASYNC(ctx, PrepareTensor(ctx, i, &refs), done);
    }
    hvdkeras::DoneCallback finish = [ctx, done](const Status& status) {
      if (!status.ok()) ctx->SetStatus(ToTfStatus(status));
      done();
    };
    const Status queued = Submit(std::move(refs), std::move(finish));
    if (!queued.ok()) {
      ctx->SetStatus(ToTfStatus(queued));
      done();
    }
  }

 protected:
  virtual Status Submit(std::vector<TensorRef> refs, hvdkeras::DoneCallback finish) = 0;
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
  Status Submit(std::vector<TensorRef> refs, hvdkeras::DoneCallback finish) override {
    return EnqueueAllreduce(tensor_name_, std::move(refs), reduce_op_, prescale_, postscale_,
                            std::move(finish));
  }

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
  Status Submit(std::vector<TensorRef> refs, hvdkeras::DoneCallback finish) override {
    return EnqueueBroadcast(tensor_name_, std::move(refs), root_rank_, std::move(finish));
  }

 private:
  int root_rank_ = 0;
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
    .SetShapeFn(hvdkeras::PassThroughShapes)
    .Doc("Copies tensors from root_rank to every rank.");

REGISTER_KERNEL_BUILDER(Name("HvdkerasAllreduce").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("HvdkerasBroadcast").Device(tensorflow::DEVICE_CPU),
                        hvdkeras::BroadcastKernel);

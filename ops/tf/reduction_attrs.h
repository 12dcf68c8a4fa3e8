// The attributes every reducing op carries: the reduction and its scale
// factors, read and checked once for all kernels that take them.
#pragma once

#include <string>

#include "core/common.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace hvdkeras {

struct ReductionAttrs {
  ReduceOp op = ReduceOp::kSum;
  float prescale = 1.0f;
  float postscale = 1.0f;
};

inline absl::Status ReadReductionAttrs(tensorflow::OpKernelConstruction* c, ReductionAttrs* out) {
  int reduce_op = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("reduce_op", &reduce_op));
  if (!IsValidReduceOp(reduce_op)) {
    return absl::InvalidArgumentError("hvdkeras: unknown reduce_op " + std::to_string(reduce_op));
  }
  out->op = static_cast<ReduceOp>(reduce_op);
  TF_RETURN_IF_ERROR(c->GetAttr("prescale_factor", &out->prescale));
  return c->GetAttr("postscale_factor", &out->postscale);
}

}  // namespace hvdkeras

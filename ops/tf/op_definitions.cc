// The TensorFlow binding's op declarations: names, attributes, inputs and
// outputs, and shape functions. The element types each op accepts come from
// the engine's table (see Note [wire vocabulary] in core/types.def). The
// collectives are stateful yet exempt from program order: see
// Note [stateful but unordered] in hvdkeras/engine/library.py.
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf/type_mapping.h"

namespace tf = tensorflow;

namespace hvdkeras {
namespace {

absl::Status PassThroughShapes(tf::shape_inference::InferenceContext* c) {
  for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

// Output shapes with an unknown first dimension (decided by negotiation).
absl::Status UnknownFirstDim(tf::shape_inference::InferenceContext* c, int num_outputs) {
  for (int i = 0; i < num_outputs; ++i) {
    tf::shape_inference::ShapeHandle out = c->input(i);
    if (c->RankKnown(out) && c->Rank(out) > 0) {
      TF_RETURN_IF_ERROR(c->ReplaceDim(out, 0, c->UnknownDim(), &out));
    }
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace hvdkeras

REGISTER_OP("HvdkerasAllreduce")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kReducible))
    .Attr("N: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    // Set only by the graph pass of Note [separate allreduces in one kernel]:
    // one engine name per tensor, each reduced as a collective of its own.
    .Attr("tensor_names: list(string) = []")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn(hvdkeras::PassThroughShapes)
    .Doc("Reduces N tensors of one dtype across all ranks in one fused call.");

REGISTER_OP("HvdkerasBroadcast")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kAny, /*list=*/true))
    .Attr("root_rank: int")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn(hvdkeras::PassThroughShapes)
    .Doc("Copies tensors from root_rank to every rank.");

REGISTER_OP("HvdkerasAllgather")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kAny))
    .Attr("N: int >= 1")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      return hvdkeras::UnknownFirstDim(c, c->num_inputs());
    })
    .Doc("Concatenates each tensor's rows from every rank, in rank order.");

REGISTER_OP("HvdkerasReducescatter")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kReducible))
    .Attr("N: int >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensors: N * T")
    .Output("outputs: N * T")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      return hvdkeras::UnknownFirstDim(c, c->num_inputs());
    })
    .Doc("Reduces tensors across ranks; each rank keeps its block of rows.");

REGISTER_OP("HvdkerasAlltoall")
    .Attr(hvdkeras::TypeAttr("T", hvdkeras::TypeSet::kAny))
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int64")
    .Output("output: T")
    .Output("received_splits: int64")
    .SetIsStateful()  // never constant-folded or deduplicated
    .SetShapeFn([](tf::shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(hvdkeras::UnknownFirstDim(c, 1));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Sends splits[r] rows to rank r and concatenates what arrives, in rank order.");

REGISTER_OP("HvdkerasBarrier")
    .Attr("tensor_name: string = ''")
    .Attr("process_set_id: int = 0")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::NoOutputs)
    .Doc("Completes once every rank has reached it.");

REGISTER_OP("HvdkerasJoin")
    .Attr("tensor_name: string = ''")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tf::shape_inference::ScalarShape)
    .Doc("Takes part in other ranks' collectives with neutral values until all ranks join.");


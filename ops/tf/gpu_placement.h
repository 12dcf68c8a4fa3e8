// Where a GPU kernel's tensors live, as the engine needs to know it: the
// GPU's ordinal and the stream TensorFlow runs the op's neighbours on (see
// Note [stream order] in core/device.h). Only GPU builds register GPU
// kernels; in a CPU build every tensor is in host memory.
#pragma once

#include "core/engine_api.h"
#include "tensorflow/core/framework/op_kernel.h"
#if HVDKERAS_CUDA
#include "xla/stream_executor/stream.h"
#endif

namespace hvdkeras {

// Whether input i of a kernel is in host memory: every input of a CPU
// kernel, and on a GPU the int32 tensors, which TensorFlow keeps on the host
// there (its MTypeFromDType); their collectives run on the CPU path.
inline bool InHostMemory(tensorflow::OpKernelContext* ctx, int i) {
  return ctx->device()->device_type() == tensorflow::DEVICE_CPU ||
         ctx->input_memory_type(i) == tensorflow::HOST_MEMORY;
}

// Marks `ref` (input i) as living on the GPU that runs `ctx` when it does;
// tensors in host memory are left there. Fails if TensorFlow gives a GPU
// kernel no stream.
inline absl::Status PlaceOnDevice(tensorflow::OpKernelContext* ctx, int i, TensorRef* ref) {
#if HVDKERAS_CUDA
  if (InHostMemory(ctx, i)) return absl::OkStatus();
  const auto* info = ctx->device()->tensorflow_accelerator_device_info();
  stream_executor::Stream* stream =
      ctx->op_device_context() ? ctx->op_device_context()->stream() : nullptr;
  if (stream == nullptr && info != nullptr) stream = info->stream;
  void* handle = stream ? stream->platform_specific_handle().stream : nullptr;
  if (info == nullptr || handle == nullptr) {
    return absl::InternalError("hvdkeras: TensorFlow gave a GPU kernel no CUDA stream");
  }
  ref->device = info->gpu_id;
  ref->framework_stream = handle;
#else
  (void)ctx;
  (void)i;
  (void)ref;
#endif
  return absl::OkStatus();
}

}  // namespace hvdkeras

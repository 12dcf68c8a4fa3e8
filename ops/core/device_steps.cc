#include "core/device_steps.h"

#include <algorithm>

namespace hvdkeras {
namespace device_steps {

Status NoDevice() {
  return Status::Error(StatusCode::kPreconditionError,
                       "internal: a GPU batch reached the engine without a device");
}

Status WaitForInputs(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  for (PendingOp* op : batch) {
    for (TensorRef& t : op->tensors) {
      if (t.ready == nullptr) continue;
      Status s = ctx.device->WaitFor(ctx.device_lane, t.ready);
      t.ready = nullptr;
      if (!s.ok()) return s;
    }
  }
  return Status::OK();
}

namespace {

// The framework streams of a batch's tensors, each once, in first-seen order
// (a joined rank's stand-ins have none). A null stream is CUDA's legacy
// default stream, torch's unless the user chose another: it is ordered like
// any other (the engine's streams do not synchronize with it implicitly).
std::vector<void*> FrameworkStreams(const std::vector<PendingOp*>& batch) {
  std::vector<void*> streams;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      if (!t.neutral &&
          std::find(streams.begin(), streams.end(), t.framework_stream) == streams.end()) {
        streams.push_back(t.framework_stream);
      }
    }
  }
  return streams;
}

}  // namespace

Status WaitForNewOutputs(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  for (void* stream : FrameworkStreams(batch)) {
    Status s = ctx.device->WaitForStream(ctx.device_lane, stream);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

Status ReleaseStreams(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  for (void* stream : FrameworkStreams(batch)) {
    Status s = ctx.device->Release(ctx.device_lane, stream);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

std::vector<TensorRef*> TensorsOf(const std::vector<PendingOp*>& batch) {
  std::vector<TensorRef*> tensors;
  for (PendingOp* op : batch) {
    for (TensorRef& t : op->tensors) tensors.push_back(&t);
  }
  return tensors;
}

namespace {

// dst = src / divisor * factor for every copy; a divisor of 1 only scales.
Status Copy(ExecContext& ctx, DataType dtype, const std::vector<DeviceCopy>& copies, int divisor,
            double factor) {
  if (copies.empty()) return Status::OK();
  return divisor > 1 ? ctx.device->CopyFinalized(ctx.device_lane, dtype, copies, divisor, factor)
                     : ctx.device->CopyScaled(ctx.device_lane, dtype, copies, factor);
}

}  // namespace

Status PackOrUnpack(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                    const PackingPlan& plan, char* buffer, DataType dtype, int divisor,
                    double factor, bool into, ReduceOp neutral_op) {
  std::vector<DeviceCopy> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    const int64_t count = NumElements(t.shape);
    if (count == 0) continue;
    char* slot = buffer + plan.offsets[i];
    if (t.neutral) {
      if (!into) continue;
      Status s = ctx.device->FillNeutral(ctx.device_lane, dtype, neutral_op, slot, count);
      if (!s.ok()) return s;
      continue;
    }
    copies.push_back(into ? DeviceCopy{t.input, slot, count}
                          : DeviceCopy{slot, t.output, count});
  }
  return Copy(ctx, dtype, copies, divisor, factor);
}

Status CopyOut(ExecContext& ctx, const std::vector<PendingOp*>& batch, DataType dtype,
               const std::vector<DeviceCopy>& copies, int divisor, double factor) {
  if (copies.empty()) return Status::OK();
  Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
  return Copy(ctx, dtype, copies, divisor, factor);
}

Status ReceiveBuffers(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                      const std::vector<Shape>& shapes, std::vector<char*>* out,
                      Status* allocation) {
  out->assign(tensors.size(), nullptr);
  std::vector<bool> in_scratch(tensors.size(), false);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i]->neutral) {
      in_scratch[i] = true;
      continue;
    }
    // A binding that allocated the output itself (its shape was known, or
    // agreed beforehand) hands it over.
    void* data = tensors[i]->output;
    Status s = data != nullptr ? Status::OK() : tensors[i]->allocate_output(shapes[i], &data);
    if (s.ok()) {
      (*out)[i] = static_cast<char*>(data);
    } else {
      in_scratch[i] = true;
      if (allocation->ok()) *allocation = s;
    }
  }
  std::vector<int64_t> offsets(tensors.size(), 0);
  int64_t scratch_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!in_scratch[i]) continue;
    offsets[i] = scratch_bytes;
    scratch_bytes += NumElements(shapes[i]) * static_cast<int64_t>(DataTypeSize(tensors[i]->dtype));
  }
  if (scratch_bytes == 0) return Status::OK();
  void* scratch = nullptr;
  Status s = ctx.device->Scratch(ctx.device_lane, kNeutralSlot, scratch_bytes, &scratch);
  if (!s.ok()) return s;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (in_scratch[i]) (*out)[i] = static_cast<char*>(scratch) + offsets[i];
  }
  return Status::OK();
}

Status FusedBuffer(ExecContext& ctx, const std::vector<TensorRef*>& tensors, PackingPlan* plan,
                   char** buffer) {
  std::vector<int64_t> bytes;
  for (const TensorRef* t : tensors) bytes.push_back(TensorBytes(*t));
  *plan = PlanPacking(bytes, kDeviceAlignment, kMaxCopiesPerLaunch);
  void* scratch = nullptr;
  Status s = ctx.device->Scratch(ctx.device_lane, kFusionSlot, plan->total_bytes, &scratch);
  *buffer = static_cast<char*>(scratch);
  return s;
}

}  // namespace device_steps
}  // namespace hvdkeras

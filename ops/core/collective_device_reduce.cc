// GPU execution of the agreed reductions: the device counterpart of
// collective_allreduce.cc and collective_reducescatter.cc. Everything is queued on the engine's stream of the batch's
// GPU through the Device and DeviceCommunicator interfaces, and the
// framework's streams are made to wait for it: see Note [stream order] in
// device.h. Nothing here waits for the GPU.
#include "core/collectives.h"
#include "core/device_steps.h"

namespace hvdkeras {

using namespace device_steps;

namespace {

// What an allreduce divides its sum by: the world size for Average, else 1.
int Divisor(const Request& r, int size) { return r.reduce_op == ReduceOp::kAverage ? size : 1; }

// Reduces `tensors` across ranks in the fused buffer: packs them in (scaled
// by the prescale; a stand-in packs the neutral element), reduces the whole
// buffer in one communicator call, then averages and postscales it.
Status ReduceInFusedBuffer(ExecContext& ctx, const std::vector<PendingOp*>& batch,
                           const std::vector<TensorRef*>& tensors, const PackingPlan& plan,
                           char* buffer) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t total = plan.total_bytes / static_cast<int64_t>(DataTypeSize(dtype));
  const int divisor = Divisor(first, ctx.mpi.size());
  Status s;
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, first.prescale, /*into=*/true,
                     first.reduce_op);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLREDUCE");
    s = ctx.device_comm->Allreduce(buffer, buffer, total, dtype, WireOp(first.reduce_op));
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  if (divisor != 1 || first.postscale != 1.0) {
    Activity scale(ctx, batch, "POSTSCALE");
    s = ctx.device->Finalize(ctx.device_lane, dtype, buffer, total, divisor, first.postscale);
  }
  return s;
}

}  // namespace

Status RunDeviceAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int divisor = Divisor(first, ctx.mpi.size());
  const bool finalize = divisor != 1 || first.postscale != 1.0;
  std::vector<TensorRef*> tensors = TensorsOf(batch);
  for (const TensorRef* t : tensors) {
    // A binding's contract (every rank's alike): GPU allreduce outputs exist
    // when the op is queued; none is allocated here.
    if (!t->neutral && t->output == nullptr && TensorBytes(*t) > 0) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "internal: a GPU allreduce tensor was queued without its output");
    }
  }
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;

  // Every rank takes the same path (the lone or the fused one) from what all
  // agreed on, or their communicator calls would not match.
  if (tensors.size() == 1) {
    // A lone tensor is reduced into its output (allocated, or the input
    // itself, when the op was queued): no fused buffer. A joined rank's
    // stand-in reduces its neutral element in scratch memory.
    TensorRef& t = *tensors[0];
    const int64_t count = NumElements(t.shape);
    void* output = t.output;
    const void* send = t.input;
    if (t.neutral) {
      s = ctx.device->Scratch(ctx.device_lane, kNeutralSlot, count * element, &output);
      if (s.ok()) s = ctx.device->FillNeutral(ctx.device_lane, dtype, first.reduce_op,
                                              output, count);
      if (!s.ok()) return s;
      send = output;
    } else if (first.prescale != 1.0) {
      Activity scale(ctx, batch, "PRESCALE");
      s = ctx.device->CopyScaled(ctx.device_lane, dtype, {{t.input, output, count}},
                                 first.prescale);
      if (!s.ok()) return s;
      send = output;
    }
    {
      Activity comm(ctx, batch, "NCCL_ALLREDUCE");
      s = ctx.device_comm->Allreduce(send, output, count, dtype, WireOp(first.reduce_op));
      if (!s.ok()) return s;
      ctx.device_comm_called = true;
    }
    if (finalize && !t.neutral) {
      Activity scale(ctx, batch, "POSTSCALE");
      s = ctx.device->Finalize(ctx.device_lane, dtype, output, count, divisor,
                               first.postscale);
      if (!s.ok()) return s;
    }
    return ReleaseStreams(ctx, batch);
  }

  PackingPlan plan;
  char* buffer = nullptr;
  s = FusedBuffer(ctx, tensors, &plan, &buffer);
  if (s.ok()) s = ReduceInFusedBuffer(ctx, batch, tensors, plan, buffer);
  if (!s.ok()) return s;
  {
    Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, 1.0, /*into=*/false, first.reduce_op);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

Status RunDeviceReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  // The whole tensors are reduced in a fused buffer (ranks may keep unequal
  // row counts, which NCCL's reduce-scatter does not take); each rank then
  // copies out its own rows.
  std::vector<TensorRef*> tensors = TensorsOf(batch);
  PackingPlan plan;
  char* buffer = nullptr;
  s = FusedBuffer(ctx, tensors, &plan, &buffer);
  if (!s.ok()) return s;
  std::vector<DeviceCopy> out;
  Status allocated;  // Note [a failed output allocation still takes part]
  bool allocated_now = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    int64_t start = 0;
    for (int r = 0; r < me; ++r) start += ScatterRows(t.shape[0], size, r);
    const int64_t rows = ScatterRows(t.shape[0], size, me);
    if (t.neutral) continue;  // a joined rank's stand-in keeps nothing
    // Bindings allocate the output when the op is queued (its rows are
    // known then); one that did not leaves it to now.
    void* output = t.output;
    if (output == nullptr && t.allocate_output) {
      s = t.allocate_output(WithRows(t.shape, rows), &output);
      allocated_now = true;
    }
    if (!s.ok()) {
      if (allocated.ok()) allocated = s;
      s = Status::OK();
      continue;
    }
    const int64_t row_elements = RowBytes(t.shape, dtype) / element;
    if (rows * row_elements > 0) {
      out.push_back({buffer + plan.offsets[i] + start * row_elements * element, output,
                     rows * row_elements});
    }
  }
  if (allocated_now) s = WaitForNewOutputs(ctx, batch);
  if (s.ok()) s = ReduceInFusedBuffer(ctx, batch, tensors, plan, buffer);
  if (!s.ok()) return s;
  if (!out.empty()) {
    Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_lane, dtype, out, 1.0);
    if (!s.ok()) return s;
  }
  // A failed allocation fails the batch; the executor then releases the
  // streams (Executor::FinishFailedDeviceBatch).
  return allocated.ok() ? ReleaseStreams(ctx, batch) : allocated;
}

}  // namespace hvdkeras

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
// by the prescale; a stand-in packs the neutral element) and reduces the
// whole buffer in one communicator call. The average's division and the
// postscale happen on the way out (CopyFinalized), in the caller's copy to
// the outputs, so the buffer is read once after the reduction.
Status ReduceInFusedBuffer(ExecContext& ctx, const std::vector<PendingOp*>& batch,
                           const std::vector<TensorRef*>& tensors, const PackingPlan& plan,
                           char* buffer) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t total = plan.total_bytes / static_cast<int64_t>(DataTypeSize(dtype));
  Status s;
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, 1, first.prescale, /*into=*/true,
                     first.reduce_op);
    if (!s.ok()) return s;
  }
  Activity comm(ctx, batch, "NCCL_ALLREDUCE");
  s = ctx.device_comm->Allreduce(buffer, buffer, total, dtype, WireOp(first.reduce_op));
  if (s.ok()) ctx.device_comm_called = true;
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
      s = ctx.device->CopyFinalized(ctx.device_lane, dtype, {{output, output, count}}, divisor,
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
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, divisor, first.postscale,
                     /*into=*/false, first.reduce_op);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

namespace {

// Note [reduce-scatter in equal blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where every tensor's first dimension divides by the ranks (JAX's always
// do, and so do stage 3's padded blocks), every rank keeps as many rows of
// each as every other, and the batch is one communicator reduce-scatter:
// each rank sends and receives (n-1)/n of the buffer once, half of what an
// allreduce moves. The fused buffer then holds one block per rank, in rank
// order; block r holds, tensor after tensor (each at a multiple of
// kDeviceAlignment), the rows rank r keeps, and the reduce-scatter leaves
// this rank's block reduced in place. Uneven rows, which NCCL's
// reduce-scatter does not take, reduce the whole buffer and keep this
// rank's rows. The choice comes from the agreed shapes, so every rank makes
// the same calls.
bool EqualBlocks(const std::vector<TensorRef*>& tensors, int size) {
  for (const TensorRef* t : tensors) {
    if (t->shape.empty() || t->shape[0] % size != 0) return false;
  }
  return true;
}

Status ReduceScatterInBlocks(ExecContext& ctx, const std::vector<PendingOp*>& batch,
                             const std::vector<TensorRef*>& tensors,
                             const std::vector<void*>& outputs) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int size = ctx.mpi.size();
  std::vector<int64_t> piece_bytes;
  for (const TensorRef* t : tensors) piece_bytes.push_back(TensorBytes(*t) / size);
  const PackingPlan block = PlanPacking(piece_bytes, kDeviceAlignment, kMaxCopiesPerLaunch);
  void* scratch = nullptr;
  Status s = ctx.device->Scratch(ctx.device_lane, kFusionSlot, block.total_bytes * size, &scratch);
  if (!s.ok()) return s;
  char* buffer = static_cast<char*>(scratch);
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    std::vector<DeviceCopy> in;
    for (int r = 0; r < size && s.ok(); ++r) {
      for (size_t i = 0; i < tensors.size() && s.ok(); ++i) {
        const int64_t count = piece_bytes[i] / element;
        if (count == 0) continue;
        char* slot = buffer + r * block.total_bytes + block.offsets[i];
        if (tensors[i]->neutral) {
          s = ctx.device->FillNeutral(ctx.device_lane, dtype, first.reduce_op, slot, count);
        } else {
          in.push_back({static_cast<const char*>(tensors[i]->input) + r * piece_bytes[i], slot,
                        count});
        }
      }
    }
    if (s.ok() && !in.empty()) {
      s = ctx.device->CopyScaled(ctx.device_lane, dtype, in, first.prescale);
    }
    if (!s.ok()) return s;
  }
  char* mine = buffer + ctx.mpi.rank() * block.total_bytes;
  const int64_t block_count = block.total_bytes / element;
  {
    Activity comm(ctx, batch, "NCCL_REDUCESCATTER");
    s = ctx.device_comm->ReduceScatter(buffer, mine, block_count, dtype,
                                       WireOp(first.reduce_op));
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  std::vector<DeviceCopy> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t count = piece_bytes[i] / element;
    if (outputs[i] != nullptr && count > 0) out.push_back({mine + block.offsets[i], outputs[i], count});
  }
  return CopyOut(ctx, batch, dtype, out, Divisor(first, size), first.postscale);
}

// Uneven rows: the whole tensors are reduced in a fused buffer, and each
// rank copies out its own rows.
Status ReduceScatterWhole(ExecContext& ctx, const std::vector<PendingOp*>& batch,
                          const std::vector<TensorRef*>& tensors,
                          const std::vector<void*>& outputs) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  PackingPlan plan;
  char* buffer = nullptr;
  Status s = FusedBuffer(ctx, tensors, &plan, &buffer);
  if (s.ok()) s = ReduceInFusedBuffer(ctx, batch, tensors, plan, buffer);
  if (!s.ok()) return s;
  std::vector<DeviceCopy> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = *tensors[i];
    int64_t start = 0;
    for (int r = 0; r < me; ++r) start += ScatterRows(t.shape[0], size, r);
    const int64_t rows = ScatterRows(t.shape[0], size, me);
    const int64_t row_elements = RowBytes(t.shape, dtype) / element;
    if (outputs[i] != nullptr && rows * row_elements > 0) {
      out.push_back({buffer + plan.offsets[i] + start * row_elements * element, outputs[i],
                     rows * row_elements});
    }
  }
  // Only this rank's rows are averaged, on their way out.
  return CopyOut(ctx, batch, dtype, out, Divisor(first, size), first.postscale);
}

}  // namespace

Status RunDeviceReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  std::vector<TensorRef*> tensors = TensorsOf(batch);
  // Bindings allocate the outputs when the op is queued (their rows are
  // known then); one that did not leaves it to now. A joined rank's
  // stand-in keeps nothing.
  std::vector<void*> outputs(tensors.size(), nullptr);
  Status allocated;  // Note [a failed output allocation still takes part]
  bool allocated_now = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    if (t.neutral) continue;
    void* output = t.output;
    if (output == nullptr && t.allocate_output) {
      allocated_now = true;
      const Status made =
          t.allocate_output(WithRows(t.shape, ScatterRows(t.shape[0], size, me)), &output);
      if (!made.ok()) {
        if (allocated.ok()) allocated = made;
        continue;
      }
    }
    outputs[i] = output;
  }
  if (allocated_now) {
    s = WaitForNewOutputs(ctx, batch);
    if (!s.ok()) return s;
  }
  // Note [reduce-scatter in equal blocks].
  s = EqualBlocks(tensors, size) ? ReduceScatterInBlocks(ctx, batch, tensors, outputs)
                                 : ReduceScatterWhole(ctx, batch, tensors, outputs);
  if (!s.ok()) return s;
  // A failed allocation fails the batch; the executor then releases the
  // streams (Executor::FinishFailedDeviceBatch).
  return allocated.ok() ? ReleaseStreams(ctx, batch) : allocated;
}

}  // namespace hvdkeras

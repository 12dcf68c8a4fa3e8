// GPU execution of the agreed collectives that move data without reducing it: the device counterpart of
// collective_broadcast.cc, collective_allgather.cc and collective_alltoall.cc. Everything is queued on the engine's stream of the batch's
// GPU through the Device and DeviceCommunicator interfaces, and the
// framework's streams are made to wait for it: see Note [stream order] in
// device.h. Nothing here waits for the GPU.
#include "core/collectives.h"
#include "core/device_steps.h"

namespace hvdkeras {

using namespace device_steps;

Status RunDeviceBroadcast(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const int root = batch[0]->request.root_rank;
  const bool is_root = ctx.mpi.rank() == root;
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  std::vector<TensorRef*> tensors = TensorsOf(batch);
  // Broadcast moves bytes: every dtype travels as uint8 here.
  // As in allreduce, the path depends only on what every rank agreed on.
  if (tensors.size() == 1) {
    TensorRef& t = *tensors[0];
    const int64_t bytes = TensorBytes(t);
    void* output = t.output;
    if (t.neutral) {  // a joined rank receives into scratch memory
      s = ctx.device->Scratch(ctx.device_lane, kNeutralSlot, bytes, &output);
      if (!s.ok()) return s;
    } else if (is_root && t.input != t.output && bytes > 0) {
      s = ctx.device->CopyScaled(ctx.device_lane, DataType::kUInt8,
                                 {{t.input, t.output, bytes}}, 1.0);
      if (!s.ok()) return s;
    }
    Activity comm(ctx, batch, "NCCL_BCAST");
    s = ctx.device_comm->Broadcast(output, bytes, root);
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
    return ReleaseStreams(ctx, batch);
  }
  PackingPlan plan;
  char* buffer = nullptr;
  s = FusedBuffer(ctx, tensors, &plan, &buffer);
  if (!s.ok()) return s;
  // The root packs its inputs; every rank then unpacks into its outputs (the
  // root too, where its output is not its input buffer).
  std::vector<DeviceCopy> in, out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    const int64_t bytes = TensorBytes(t);
    if (bytes == 0 || t.neutral) continue;
    in.push_back({t.input, buffer + plan.offsets[i], bytes});
    if (!is_root || t.output != t.input) {
      out.push_back({buffer + plan.offsets[i], t.output, bytes});
    }
  }
  if (is_root && !in.empty()) {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_lane, DataType::kUInt8, in, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_BCAST");
    s = ctx.device_comm->Broadcast(buffer, plan.total_bytes, root);
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  s = CopyOut(ctx, batch, DataType::kUInt8, out);
  if (!s.ok()) return s;
  return ReleaseStreams(ctx, batch);
}

namespace {

// Note [allgather in equal blocks]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Where every rank gives as many rows of each tensor as every other (JAX's
// gathers, stage 3's padded blocks), the batch is one communicator
// allgather, which NCCL runs as a ring (or NVLS) instead of all pairs of
// sends and receives. A lone tensor is gathered straight into its output
// (rank r's rows land at r's place); several are packed into this rank's
// block of a fused buffer (each at a multiple of kDeviceAlignment),
// gathered in place, and unpacked rank by rank. Rows come from the agreed
// sizes, so every rank takes the same path; a joined rank gives no rows,
// so an equal batch with rows holds no stand-ins.
bool EqualRows(const std::vector<std::vector<int64_t>>& rows) {
  for (const std::vector<int64_t>& per_rank : rows) {
    for (int64_t r : per_rank) {
      if (r != per_rank[0]) return false;
    }
  }
  return true;
}

Status AllgatherInBlocks(ExecContext& ctx, const std::vector<PendingOp*>& batch,
                         const std::vector<TensorRef*>& tensors,
                         const std::vector<std::vector<int64_t>>& rows,
                         const std::vector<char*>& outputs) {
  const int size = ctx.mpi.size();
  std::vector<int64_t> piece;
  for (size_t i = 0; i < tensors.size(); ++i) {
    piece.push_back(rows[i][0] * RowBytes(tensors[i]->shape, tensors[i]->dtype));
  }
  Status s;
  if (tensors.size() == 1) {
    Activity comm(ctx, batch, "NCCL_ALLGATHER");
    s = ctx.device_comm->Allgather(tensors[0]->input, outputs[0], piece[0]);
    if (s.ok()) ctx.device_comm_called = true;
    return s;
  }
  const PackingPlan block = PlanPacking(piece, kDeviceAlignment, kMaxCopiesPerLaunch);
  void* scratch = nullptr;
  s = ctx.device->Scratch(ctx.device_lane, kFusionSlot, block.total_bytes * size, &scratch);
  if (!s.ok()) return s;
  char* buffer = static_cast<char*>(scratch);
  char* mine = buffer + ctx.mpi.rank() * block.total_bytes;
  std::vector<DeviceCopy> in, out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (piece[i] > 0) in.push_back({tensors[i]->input, mine + block.offsets[i], piece[i]});
  }
  if (!in.empty()) {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_lane, DataType::kUInt8, in, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLGATHER");
    s = ctx.device_comm->Allgather(mine, buffer, block.total_bytes);
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (piece[i] > 0) {
        out.push_back({buffer + r * block.total_bytes + block.offsets[i],
                       outputs[i] + r * piece[i], piece[i]});
      }
    }
  }
  return CopyOut(ctx, batch, DataType::kUInt8, out);
}

}  // namespace

Status RunDeviceAllgather(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  // Every tensor: rank r's rows go to every rank, at r's place in the output.
  std::vector<TensorRef*> tensors;
  std::vector<std::vector<int64_t>> rows;  // per tensor, per rank
  std::vector<Shape> shapes;
  for (PendingOp* op : batch) {
    for (size_t t = 0; t < op->tensors.size(); ++t) {
      TensorRef& ref = op->tensors[t];
      tensors.push_back(&ref);
      rows.emplace_back(op->response->sizes.begin() + t * size,
                        op->response->sizes.begin() + (t + 1) * size);
      int64_t total_rows = 0;
      for (int64_t r : rows.back()) total_rows += r;
      shapes.push_back(WithRows(ref.shape, total_rows));
    }
  }
  std::vector<char*> outputs;
  Status allocated;  // Note [a failed output allocation still takes part]
  s = ReceiveBuffers(ctx, tensors, shapes, &outputs, &allocated);
  if (!s.ok()) return s;
  if (EqualRows(rows)) {  // Note [allgather in equal blocks]
    s = WaitForNewOutputs(ctx, batch);
    if (s.ok()) s = AllgatherInBlocks(ctx, batch, tensors, rows, outputs);
    if (!s.ok()) return s;
    return allocated.ok() ? ReleaseStreams(ctx, batch) : allocated;
  }
  std::vector<DeviceSegment> sends, recvs;
  std::vector<DeviceCopy> own;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& ref = *tensors[i];
    const int64_t row_bytes = RowBytes(ref.shape, ref.dtype);
    std::vector<int64_t> bytes(size);
    for (int r = 0; r < size; ++r) bytes[r] = rows[i][r] * row_bytes;
    const std::vector<int64_t> displs = Offsets(bytes);
    for (int r = 0; r < size; ++r) {
      if (r == me) {
        if (bytes[me] > 0) own.push_back({ref.input, outputs[i] + displs[me], bytes[me]});
        continue;
      }
      if (bytes[me] > 0) sends.push_back({r, const_cast<void*>(ref.input), bytes[me]});
      if (bytes[r] > 0) recvs.push_back({r, outputs[i] + displs[r], bytes[r]});
    }
  }
  s = WaitForNewOutputs(ctx, batch);
  if (!s.ok()) return s;
  if (!own.empty()) {
    s = ctx.device->CopyScaled(ctx.device_lane, DataType::kUInt8, own, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLGATHER");
    s = ctx.device_comm->Exchange(sends, recvs);
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  // A failed allocation fails the batch; the executor then releases the
  // streams (Executor::FinishFailedDeviceBatch).
  return allocated.ok() ? ReleaseStreams(ctx, batch) : allocated;
}

Status RunDeviceAlltoall(ExecContext& ctx, PendingOp* op) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const std::vector<PendingOp*> batch{op};
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  TensorRef& ref = op->tensors[0];
  const AlltoallCounts counts = CountAlltoall(*op, size, me);
  const std::vector<int64_t>& send_bytes = counts.send_bytes;
  const std::vector<int64_t>& recv_bytes = counts.recv_bytes;
  std::vector<char*> outputs;
  Status allocated;  // Note [a failed output allocation still takes part]
  s = ReceiveBuffers(ctx, {&ref}, {WithRows(ref.shape, counts.recv_rows)}, &outputs,
                     &allocated);
  if (!s.ok()) return s;
  char* output = outputs[0];
  if (allocated.ok() && ref.receive_splits) ref.receive_splits(counts.received);
  s = WaitForNewOutputs(ctx, batch);
  if (!s.ok()) return s;
  const std::vector<int64_t> send_displs = Offsets(send_bytes);
  const std::vector<int64_t> recv_displs = Offsets(recv_bytes);
  const char* input = static_cast<const char*>(ref.input);
  std::vector<DeviceSegment> sends, recvs;
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    if (send_bytes[r] > 0) {
      sends.push_back({r, const_cast<char*>(input) + send_displs[r], send_bytes[r]});
    }
    if (recv_bytes[r] > 0) recvs.push_back({r, output + recv_displs[r], recv_bytes[r]});
  }
  if (send_bytes[me] > 0) {
    s = ctx.device->CopyScaled(ctx.device_lane, DataType::kUInt8,
                               {{input + send_displs[me], output + recv_displs[me],
                                 send_bytes[me]}}, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLTOALL");
    s = ctx.device_comm->Exchange(sends, recvs);
    if (!s.ok()) return s;
    ctx.device_comm_called = true;
  }
  // A failed allocation fails the batch; the executor then releases the
  // streams (Executor::FinishFailedDeviceBatch).
  return allocated.ok() ? ReleaseStreams(ctx, batch) : allocated;
}

}  // namespace hvdkeras

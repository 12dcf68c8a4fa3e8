// GPU execution of agreed collectives: the device counterpart of the
// collective_<kind>.cc files. Everything is queued on the engine's stream of
// the batch's GPU through the Device and DeviceCommunicator interfaces, and
// the framework's streams are made to wait for it: see Note [stream order]
// in device.h. Nothing here waits for the GPU.
#include <cstring>

#include "core/collectives.h"
#include "core/device_packing.h"

namespace hvdkeras {

namespace {

// Fused buffers put each tensor at a multiple of this (what NCCL and the
// copy kernels handle fastest; a multiple of every element size).
constexpr int64_t kDeviceAlignment = 256;

// What the communicator reduces with: an average is a sum, divided on the
// device afterwards (Finalize), exactly as the CPU path rounds it.
ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// Scratch buffers that live at the same time within one batch.
enum ScratchSlot { kFusionSlot = 0, kNeutralSlot = 1 };

Status NoDevice() {
  return Status::Error(StatusCode::kPreconditionError,
                       "internal: a GPU batch reached the engine without a device");
}

// The engine stream waits for every input's ready event (recorded when the
// op was queued, after its framework-allocated outputs existed).
Status WaitForInputs(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  for (PendingOp* op : batch) {
    for (TensorRef& t : op->tensors) {
      if (t.ready == nullptr) continue;
      Status s = ctx.device->WaitFor(ctx.device_ordinal, t.ready);
      t.ready = nullptr;
      if (!s.ok()) return s;
    }
  }
  return Status::OK();
}

// Outputs allocated now, on the engine thread, come from the framework's
// allocator: the engine stream waits for what their framework streams have
// queued so far before writing them.
Status WaitForNewOutputs(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  std::vector<void*> streams;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      if (t.framework_stream == nullptr) continue;
      bool seen = false;
      for (void* s : streams) seen = seen || s == t.framework_stream;
      if (!seen) streams.push_back(t.framework_stream);
    }
  }
  for (void* stream : streams) {
    Status s = ctx.device->WaitForStream(ctx.device_ordinal, stream);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

// Every framework stream of the batch waits for the engine stream's work.
Status ReleaseStreams(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  std::vector<void*> done;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      if (t.framework_stream == nullptr) continue;
      bool seen = false;
      for (void* s : done) seen = seen || s == t.framework_stream;
      if (seen) continue;
      done.push_back(t.framework_stream);
      Status s = ctx.device->Release(ctx.device_ordinal, t.framework_stream);
      if (!s.ok()) return s;
    }
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

// Copies (or scales) element ranges of the tensors into a fused buffer at
// their planned offsets (`into`), or out of it. Stand-ins contribute the
// neutral element and receive nothing.
Status PackOrUnpack(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                    const PackingPlan& plan, char* buffer, DataType dtype, double factor,
                    bool into, ReduceOp neutral_op) {
  std::vector<DeviceCopy> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    const int64_t count = NumElements(t.shape);
    if (count == 0) continue;
    char* slot = buffer + plan.offsets[i];
    if (t.neutral) {
      if (!into) continue;
      Status s = ctx.device->FillNeutral(ctx.device_ordinal, dtype, neutral_op, slot, count);
      if (!s.ok()) return s;
      continue;
    }
    copies.push_back(into ? DeviceCopy{t.input, slot, count}
                          : DeviceCopy{slot, t.output, count});
  }
  return copies.empty() ? Status::OK()
                        : ctx.device->CopyScaled(ctx.device_ordinal, dtype, copies, factor);
}

// Where each tensor's received rows go: its output, allocated now by the
// framework, or for a joined rank's stand-in (whose result is dropped) a
// part of one device scratch buffer, taken once for the whole batch (a
// scratch buffer that grows gives up its old memory).
Status ReceiveBuffers(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                      const std::vector<Shape>& shapes, std::vector<char*>* out) {
  std::vector<int64_t> neutral_offsets(tensors.size(), 0);
  int64_t neutral_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i]->neutral) continue;
    neutral_offsets[i] = neutral_bytes;
    neutral_bytes += NumElements(shapes[i]) * static_cast<int64_t>(DataTypeSize(tensors[i]->dtype));
  }
  void* scratch = nullptr;
  if (neutral_bytes > 0) {
    Status s = ctx.device->Scratch(ctx.device_ordinal, kNeutralSlot, neutral_bytes, &scratch);
    if (!s.ok()) return s;
  }
  out->assign(tensors.size(), nullptr);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i]->neutral) {
      (*out)[i] = static_cast<char*>(scratch) + neutral_offsets[i];
      continue;
    }
    void* data = nullptr;
    Status s = tensors[i]->allocate_output(shapes[i], &data);
    if (!s.ok()) return s;
    (*out)[i] = static_cast<char*>(data);
  }
  return Status::OK();
}

// The fused layout of `tensors` (byte sizes at the device alignment).
PackingPlan PlanFor(const std::vector<TensorRef*>& tensors) {
  std::vector<int64_t> bytes;
  for (const TensorRef* t : tensors) bytes.push_back(TensorBytes(*t));
  return PlanPacking(bytes, kDeviceAlignment, kMaxCopiesPerLaunch);
}

}  // namespace

Status RunDeviceAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int divisor = first.reduce_op == ReduceOp::kAverage ? ctx.mpi.size() : 1;
  const bool finalize = divisor != 1 || first.postscale != 1.0;
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  std::vector<TensorRef*> tensors = TensorsOf(batch);

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
      s = ctx.device->Scratch(ctx.device_ordinal, kNeutralSlot, count * element, &output);
      if (s.ok()) s = ctx.device->FillNeutral(ctx.device_ordinal, dtype, first.reduce_op,
                                              output, count);
      if (!s.ok()) return s;
      send = output;
    } else if (first.prescale != 1.0) {
      Activity scale(ctx, batch, "PRESCALE");
      s = ctx.device->CopyScaled(ctx.device_ordinal, dtype, {{t.input, output, count}},
                                 first.prescale);
      if (!s.ok()) return s;
      send = output;
    }
    {
      Activity comm(ctx, batch, "NCCL_ALLREDUCE");
      s = ctx.device_comm->Allreduce(send, output, count, dtype, WireOp(first.reduce_op));
      if (!s.ok()) return s;
    }
    if (finalize && !t.neutral) {
      Activity scale(ctx, batch, "POSTSCALE");
      s = ctx.device->Finalize(ctx.device_ordinal, dtype, output, count, divisor,
                               first.postscale);
      if (!s.ok()) return s;
    }
    return ReleaseStreams(ctx, batch);
  }

  const PackingPlan plan = PlanFor(tensors);
  void* scratch = nullptr;
  s = ctx.device->Scratch(ctx.device_ordinal, kFusionSlot, plan.total_bytes, &scratch);
  if (!s.ok()) return s;
  char* buffer = static_cast<char*>(scratch);
  const int64_t total = plan.total_bytes / element;
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
  }
  if (finalize) {
    Activity scale(ctx, batch, "POSTSCALE");
    s = ctx.device->Finalize(ctx.device_ordinal, dtype, buffer, total, divisor,
                             first.postscale);
    if (!s.ok()) return s;
  }
  {
    Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, 1.0, /*into=*/false, first.reduce_op);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

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
      s = ctx.device->Scratch(ctx.device_ordinal, kNeutralSlot, bytes, &output);
      if (!s.ok()) return s;
    } else if (is_root && t.input != t.output && bytes > 0) {
      s = ctx.device->CopyScaled(ctx.device_ordinal, DataType::kUInt8,
                                 {{t.input, t.output, bytes}}, 1.0);
      if (!s.ok()) return s;
    }
    Activity comm(ctx, batch, "NCCL_BCAST");
    s = ctx.device_comm->Broadcast(output, bytes, root);
    if (!s.ok()) return s;
    return ReleaseStreams(ctx, batch);
  }
  std::vector<int64_t> sizes;
  for (const TensorRef* t : tensors) sizes.push_back(TensorBytes(*t));
  const PackingPlan plan = PlanPacking(sizes, kDeviceAlignment, kMaxCopiesPerLaunch);
  void* scratch = nullptr;
  s = ctx.device->Scratch(ctx.device_ordinal, kFusionSlot, plan.total_bytes, &scratch);
  if (!s.ok()) return s;
  char* buffer = static_cast<char*>(scratch);
  // The root packs its inputs; every rank then unpacks into its outputs (the
  // root too, where its output is not its input buffer).
  std::vector<DeviceCopy> in, out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    if (sizes[i] == 0 || t.neutral) continue;
    in.push_back({t.input, buffer + plan.offsets[i], sizes[i]});
    if (!is_root || t.output != t.input) {
      out.push_back({buffer + plan.offsets[i], t.output, sizes[i]});
    }
  }
  if (is_root && !in.empty()) {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_ordinal, DataType::kUInt8, in, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_BCAST");
    s = ctx.device_comm->Broadcast(buffer, plan.total_bytes, root);
    if (!s.ok()) return s;
  }
  if (!out.empty()) {
    Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_ordinal, DataType::kUInt8, out, 1.0);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

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
  s = ReceiveBuffers(ctx, tensors, shapes, &outputs);
  if (!s.ok()) return s;
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
    s = ctx.device->CopyScaled(ctx.device_ordinal, DataType::kUInt8, own, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLGATHER");
    s = ctx.device_comm->Exchange(sends, recvs);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

Status RunDeviceAlltoall(ExecContext& ctx, PendingOp* op) {
  if (ctx.device == nullptr || ctx.device_comm == nullptr) return NoDevice();
  const std::vector<PendingOp*> batch{op};
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  TensorRef& ref = op->tensors[0];
  const int64_t row_bytes = RowBytes(ref.shape, ref.dtype);
  const std::vector<int64_t>& matrix = op->response->sizes;  // [sender * size + receiver]
  std::vector<int64_t> send_bytes(size), recv_bytes(size), received(size);
  int64_t recv_rows = 0;
  for (int r = 0; r < size; ++r) {
    send_bytes[r] = matrix[me * size + r] * row_bytes;
    received[r] = matrix[r * size + me];
    recv_bytes[r] = received[r] * row_bytes;
    recv_rows += received[r];
  }
  std::vector<char*> outputs;
  s = ReceiveBuffers(ctx, {&ref}, {WithRows(ref.shape, recv_rows)}, &outputs);
  if (!s.ok()) return s;
  char* output = outputs[0];
  if (ref.receive_splits) ref.receive_splits(received);
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
    s = ctx.device->CopyScaled(ctx.device_ordinal, DataType::kUInt8,
                               {{input + send_displs[me], output + recv_displs[me],
                                 send_bytes[me]}}, 1.0);
    if (!s.ok()) return s;
  }
  {
    Activity comm(ctx, batch, "NCCL_ALLTOALL");
    s = ctx.device_comm->Exchange(sends, recvs);
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
  const int divisor = first.reduce_op == ReduceOp::kAverage ? size : 1;
  Status s = WaitForInputs(ctx, batch);
  if (!s.ok()) return s;
  // The whole tensors are reduced in a fused buffer (ranks may keep unequal
  // row counts, which NCCL's reduce-scatter does not take); each rank then
  // copies out its own rows.
  std::vector<TensorRef*> tensors = TensorsOf(batch);
  const PackingPlan plan = PlanFor(tensors);
  void* scratch = nullptr;
  s = ctx.device->Scratch(ctx.device_ordinal, kFusionSlot, plan.total_bytes, &scratch);
  if (!s.ok()) return s;
  char* buffer = static_cast<char*>(scratch);
  std::vector<DeviceCopy> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    int64_t start = 0;
    for (int r = 0; r < me; ++r) start += ScatterRows(t.shape[0], size, r);
    const int64_t rows = ScatterRows(t.shape[0], size, me);
    if (t.neutral) continue;  // a joined rank's stand-in keeps nothing
    void* output = nullptr;
    s = t.allocate_output(WithRows(t.shape, rows), &output);
    if (!s.ok()) return s;
    const int64_t row_elements = RowBytes(t.shape, dtype) / element;
    if (rows * row_elements > 0) {
      out.push_back({buffer + plan.offsets[i] + start * row_elements * element, output,
                     rows * row_elements});
    }
  }
  s = WaitForNewOutputs(ctx, batch);
  if (!s.ok()) return s;
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    s = PackOrUnpack(ctx, tensors, plan, buffer, dtype, first.prescale, /*into=*/true,
                     first.reduce_op);
    if (!s.ok()) return s;
  }
  const int64_t total = plan.total_bytes / element;
  {
    Activity comm(ctx, batch, "NCCL_ALLREDUCE");
    s = ctx.device_comm->Allreduce(buffer, buffer, total, dtype, WireOp(first.reduce_op));
    if (!s.ok()) return s;
  }
  if (divisor != 1 || first.postscale != 1.0) {
    s = ctx.device->Finalize(ctx.device_ordinal, dtype, buffer, total, divisor,
                             first.postscale);
    if (!s.ok()) return s;
  }
  if (!out.empty()) {
    Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
    s = ctx.device->CopyScaled(ctx.device_ordinal, dtype, out, 1.0);
    if (!s.ok()) return s;
  }
  return ReleaseStreams(ctx, batch);
}

}  // namespace hvdkeras

// Execution of agreed collectives over MPI, one function per kind, each in
// its own collective_<kind>.cc. Each runs a batch of ops that the fusion
// planner grouped (same kind and key); ranks call them in the same order
// with matching batches.
#pragma once

#include <string>
#include <vector>

#include "core/block_pool.h"
#include "core/device.h"
#include "core/pending_op.h"
#include "core/mpi_context.h"
#include "core/shm_allreduce.h"
#include "core/timeline.h"

namespace hvdkeras {

// Note [a failed output allocation still takes part]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An output allocated once the shapes are agreed (allgather, alltoall,
// reducescatter) can fail on one rank only: out of memory, or, under
// jax.jit, a shape other than the one the compiled step planned. The other
// ranks are then already in the data exchange, and a rank that returned
// early would leave them waiting in MPI until the stall bound ends the
// whole job. So a rank whose allocation failed still exchanges (receiving
// into scratch memory) and reports its error afterwards: it fails, the
// others finish. On the GPU path (device_steps.cc's ReceiveBuffers) the
// rank receives into its lane's scratch memory, makes the same NCCL call
// as the others, and then fails only that batch, after the framework's
// streams were made to wait for the lane (Executor::FinishFailedDeviceBatch);
// its session stays usable, since its communicator calls stayed in step
// (Note [a failed GPU batch ends every rank] in device_session.h).

// Note [one summation order on a host]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Floating-point addition is not associative, so two collectives that add
// the same contributions in different orders can differ in the last bits,
// and an optimizer that normalises (Adam) can blow that up over many steps.
// Sharded optimizer state must give the weights that the plain allreduce
// gives (ZeRO stage 2 reduce-scatters what stage 0 allreduces), so on one
// host every floating-point sum, average or product combines the ranks'
// contributions left to right in rank order, ((x0 + x1) + x2) + ...,
// through shared memory (ShmAllreduce::ReduceSlice): the allreduce at every
// size once there are three ranks or more (with two, every order is the
// same, and small buffers keep MPI's faster path), and the reduce-scatter
// always. The result of each element is then the same whatever the fusion,
// the slicing or the collective. Across hosts the cross step (MPI or the
// ring) has orders of its own; on GPUs NCCL chooses.

// A growable scratch buffer reused across cycles.
class FusionBuffer {
 public:
  char* Get(int64_t bytes) {
    if (static_cast<int64_t>(data_.size()) < bytes) data_.resize(bytes);
    return data_.data();
  }

 private:
  std::vector<char> data_;
};

struct ExecContext {
  const MpiContext& mpi;
  FusionBuffer& buffer;
  Timeline* timeline;  // null unless rank 0 is tracing
  BlockPool* blocks;   // fused allreduce results handed out as outputs
  ShmAllreduce* shm;   // allreduce through shared memory, when active
  // GPU batches (collective_device_*.cc): the device, its communicator and
  // this engine's lane on this rank's GPU (Note [device lanes]).
  Device* device = nullptr;
  DeviceCommunicator* device_comm = nullptr;
  DeviceLane device_lane{};
  // Set once the batch's communicator call was made: a batch that fails
  // before it leaves this rank's communicator a call behind the others'
  // (Note [a failed GPU batch ends every rank] in device_session.h).
  bool device_comm_called = false;
};

// Whether a CPU allreduce of this dtype and op goes through shared memory
// whatever its size (Note [one summation order on a host]).
bool FoldsAtEverySize(const ExecContext& ctx, DataType dtype, ReduceOp op);

// Records an execution phase of every op in a batch on the timeline.
class Activity {
 public:
  Activity(ExecContext& ctx, const std::vector<PendingOp*>& batch, const char* name)
      : timeline_(ctx.timeline), batch_(batch) {
    if (!timeline_) return;
    for (PendingOp* op : batch_) timeline_->ActivityStart(op->request.name, name);
  }
  ~Activity() {
    if (!timeline_) return;
    for (PendingOp* op : batch_) timeline_->ActivityEnd(op->request.name);
  }

 private:
  Timeline* timeline_;
  const std::vector<PendingOp*>& batch_;
};

inline int64_t TensorBytes(const TensorRef& t) {
  return NumElements(t.shape) * static_cast<int64_t>(DataTypeSize(t.dtype));
}

inline bool IsSingleTensor(const std::vector<PendingOp*>& batch) {
  return batch.size() == 1 && batch[0]->tensors.size() == 1;
}

// Bytes of one row (everything but the first dimension).
inline int64_t RowBytes(const Shape& shape, DataType dtype) {
  int64_t n = static_cast<int64_t>(DataTypeSize(dtype));
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

inline Shape WithRows(const Shape& shape, int64_t rows) {
  Shape out = shape;
  out[0] = rows;
  return out;
}

// Bytes an executed allgather left on this rank: every rank's rows of each of
// its tensors (the response holds the rows, tensor by tensor, rank by rank).
// engine_stats() counts them as gathered.
inline int64_t AllgatheredBytes(const PendingOp& op) {
  if (op.response == nullptr || op.tensors.empty()) return 0;
  const size_t size = op.response->sizes.size() / op.tensors.size();
  int64_t bytes = 0;
  for (size_t t = 0; t < op.tensors.size(); ++t) {
    int64_t rows = 0;
    for (size_t r = 0; r < size; ++r) rows += op.response->sizes[t * size + r];
    bytes += rows * RowBytes(op.tensors[t].shape, op.tensors[t].dtype);
  }
  return bytes;
}

// Exclusive prefix sums: where each of `counts` starts when laid end to end.
inline std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

Status RunAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunBroadcast(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunAllgather(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunAlltoall(ExecContext& ctx, PendingOp* op);
Status RunReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch);

// The same on GPUs, through the Device and DeviceCommunicator of `ctx`.
Status RunDeviceAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunDeviceBroadcast(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunDeviceAllgather(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunDeviceAlltoall(ExecContext& ctx, PendingOp* op);
Status RunDeviceReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch);

// What this rank sends to and receives from each rank in an alltoall, from
// the agreed matrix of rows (response->sizes, [sender * size + receiver]).
struct AlltoallCounts {
  std::vector<int64_t> send_bytes, recv_bytes;
  std::vector<int64_t> received;  // rows from each rank
  int64_t recv_rows = 0;
};
AlltoallCounts CountAlltoall(const PendingOp& op, int size, int me);

// Rows of a first dimension of `rows` that rank r receives in reducescatter.
int64_t ScatterRows(int64_t rows, int size, int r);

}  // namespace hvdkeras

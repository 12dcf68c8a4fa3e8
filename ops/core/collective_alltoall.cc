// Alltoall execution: splits[r] rows to rank r, received rows in rank order.
#include "core/collectives.h"

namespace hvdkeras {

AlltoallCounts CountAlltoall(const PendingOp& op, int size, int me) {
  const TensorRef& ref = op.tensors[0];
  const int64_t row_bytes = RowBytes(ref.shape, ref.dtype);
  const std::vector<int64_t>& matrix = op.response->sizes;
  AlltoallCounts c;
  c.send_bytes.resize(size);
  c.recv_bytes.resize(size);
  c.received.resize(size);
  for (int r = 0; r < size; ++r) {
    c.send_bytes[r] = matrix[me * size + r] * row_bytes;
    c.received[r] = matrix[r * size + me];
    c.recv_bytes[r] = c.received[r] * row_bytes;
    c.recv_rows += c.received[r];
  }
  return c;
}

Status RunAlltoall(ExecContext& ctx, PendingOp* op) {
  const TensorRef& ref = op->tensors[0];
  const AlltoallCounts c = CountAlltoall(*op, ctx.mpi.size(), ctx.mpi.rank());
  void* out = nullptr;
  const Status allocated = ref.allocate_output(WithRows(ref.shape, c.recv_rows), &out);
  if (!allocated.ok()) {
    // Note [a failed output allocation still takes part] in collectives.h.
    int64_t total = 0;
    for (int64_t bytes : c.recv_bytes) total += bytes;
    out = ctx.buffer.Get(total);
  } else if (ref.receive_splits) {
    ref.receive_splits(c.received);
  }
  const std::vector<PendingOp*> batch{op};
  Activity mpi(ctx, batch, "MPI_ALLTOALL");
  Status s = ctx.mpi.Alltoallv(ref.input, c.send_bytes, Offsets(c.send_bytes), out,
                               c.recv_bytes, Offsets(c.recv_bytes));
  return allocated.ok() ? s : allocated;
}

}  // namespace hvdkeras

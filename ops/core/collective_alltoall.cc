// Alltoall execution: splits[r] rows to rank r, received rows in rank order.
#include "core/collectives.h"

namespace hvdkeras {

Status RunAlltoall(ExecContext& ctx, PendingOp* op) {
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  const TensorRef& ref = op->tensors[0];
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
  void* out = nullptr;
  Status s = ref.allocate_output(WithRows(ref.shape, recv_rows), &out);
  if (!s.ok()) return s;
  if (ref.receive_splits) ref.receive_splits(received);
  const std::vector<PendingOp*> batch{op};
  Activity mpi(ctx, batch, "MPI_ALLTOALL");
  return ctx.mpi.Alltoallv(ref.input, send_bytes, Offsets(send_bytes), out, recv_bytes,
                           Offsets(recv_bytes));
}

}  // namespace hvdkeras

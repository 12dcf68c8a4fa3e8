// Broadcast execution: one tensor straight from the root's buffer, several
// through the fusion buffer.
#include <cstring>

#include "core/collectives.h"

namespace hvdkeras {

Status RunBroadcast(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  const int root = batch[0]->request.root_rank;
  const bool is_root = ctx.mpi.rank() == root;
  if (is_root) {  // the root's outputs are its inputs
    for (PendingOp* op : batch) {
      for (const TensorRef& t : op->tensors) {
        if (t.input != t.output) std::memcpy(t.output, t.input, TensorBytes(t));
      }
    }
  }
  if (IsSingleTensor(batch)) {
    const TensorRef& t = batch[0]->tensors[0];
    Activity mpi(ctx, batch, "MPI_BCAST");
    return ctx.mpi.Broadcast(t.output, TensorBytes(t), root);
  }
  int64_t total = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) total += TensorBytes(t);
  }
  char* buffer = ctx.buffer.Get(total);
  if (is_root) {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    int64_t offset = 0;
    for (PendingOp* op : batch) {
      for (const TensorRef& t : op->tensors) {
        std::memcpy(buffer + offset, t.input, TensorBytes(t));
        offset += TensorBytes(t);
      }
    }
  }
  {
    Activity mpi(ctx, batch, "MPI_BCAST");
    Status s = ctx.mpi.Broadcast(buffer, total, root);
    if (!s.ok() || is_root) return s;
  }
  Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
  int64_t offset = 0;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      std::memcpy(t.output, buffer + offset, TensorBytes(t));
      offset += TensorBytes(t);
    }
  }
  return Status::OK();
}

}  // namespace hvdkeras

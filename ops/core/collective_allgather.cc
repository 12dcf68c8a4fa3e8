// Allgather execution, fused across the tensors of a batch.
#include <cstring>
#include <numeric>

#include "core/collectives.h"

namespace hvdkeras {

namespace {

// One tensor of an allgather batch: where its pieces come from and go to.
struct GatherPiece {
  const TensorRef* tensor;
  std::vector<int64_t> rows;  // per rank
  int64_t row_bytes;
  char* output;
};

}  // namespace

Status RunAllgather(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  std::vector<GatherPiece> pieces;
  Status allocated;  // the first failed allocation, returned after the exchange
  for (PendingOp* op : batch) {
    for (size_t t = 0; t < op->tensors.size(); ++t) {
      const TensorRef& ref = op->tensors[t];
      GatherPiece piece{&ref, {}, RowBytes(ref.shape, ref.dtype), nullptr};
      piece.rows.assign(op->response->sizes.begin() + t * size,
                        op->response->sizes.begin() + (t + 1) * size);
      const int64_t total_rows = std::accumulate(piece.rows.begin(), piece.rows.end(), int64_t{0});
      void* out = nullptr;
      Status s = ref.allocate_output(WithRows(ref.shape, total_rows), &out);
      // Note [a failed output allocation still takes part] in collectives.h.
      if (!s.ok() && allocated.ok()) allocated = s;
      piece.output = s.ok() ? static_cast<char*>(out) : nullptr;
      pieces.push_back(std::move(piece));
    }
  }

  // Bytes each rank contributes: its rows of every tensor, back to back.
  std::vector<int64_t> block(size, 0);
  for (const GatherPiece& p : pieces) {
    for (int r = 0; r < size; ++r) block[r] += p.rows[r] * p.row_bytes;
  }
  const std::vector<int64_t> displs = Offsets(block);

  const int64_t total = displs[size - 1] + block[size - 1];
  const char* exchange =
      ctx.mpi.RingTakes(total, DataType::kUInt8) ? "RING_ALLGATHER" : "MPI_ALLGATHER";
  if (pieces.size() == 1) {  // gather straight into the output
    const GatherPiece& p = pieces[0];
    char* into = p.output != nullptr ? p.output : ctx.buffer.Get(total);
    Activity mpi(ctx, batch, exchange);
    Status s = ctx.mpi.Allgatherv(p.tensor->input, block[me], into, block, displs);
    return allocated.ok() ? s : allocated;
  }

  char* buffer = ctx.buffer.Get(total + block[me]);
  char* send = buffer + total;
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    int64_t offset = 0;
    for (const GatherPiece& p : pieces) {
      const int64_t bytes = p.rows[me] * p.row_bytes;
      std::memcpy(send + offset, p.tensor->input, bytes);
      offset += bytes;
    }
  }
  {
    Activity mpi(ctx, batch, exchange);
    Status s = ctx.mpi.Allgatherv(send, block[me], buffer, block, displs);
    if (!s.ok()) return s;
  }
  Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
  std::vector<int64_t> written(pieces.size(), 0);
  for (int r = 0; r < size; ++r) {
    int64_t offset = displs[r];
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int64_t bytes = pieces[i].rows[r] * pieces[i].row_bytes;
      if (pieces[i].output != nullptr) {
        std::memcpy(pieces[i].output + written[i], buffer + offset, bytes);
      }
      written[i] += bytes;
      offset += bytes;
    }
  }
  return allocated;
}

}  // namespace hvdkeras

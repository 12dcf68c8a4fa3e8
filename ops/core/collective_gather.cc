// Allgather (fused across tensors) and alltoall execution.
#include <cstring>
#include <numeric>

#include "core/collectives.h"

namespace hvdkeras {

namespace {

int64_t RowBytes(const Shape& shape, DataType dtype) {
  int64_t n = static_cast<int64_t>(DataTypeSize(dtype));
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

Shape WithRows(const Shape& shape, int64_t rows) {
  Shape out = shape;
  out[0] = rows;
  return out;
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

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
  for (PendingOp* op : batch) {
    for (size_t t = 0; t < op->tensors.size(); ++t) {
      const TensorRef& ref = op->tensors[t];
      GatherPiece piece{&ref, {}, RowBytes(ref.shape, ref.dtype), nullptr};
      piece.rows.assign(op->response->sizes.begin() + t * size,
                        op->response->sizes.begin() + (t + 1) * size);
      const int64_t total_rows = std::accumulate(piece.rows.begin(), piece.rows.end(), int64_t{0});
      void* out = nullptr;
      Status s = ref.allocate_output(WithRows(ref.shape, total_rows), &out);
      if (!s.ok()) return s;
      piece.output = static_cast<char*>(out);
      pieces.push_back(std::move(piece));
    }
  }

  // Bytes each rank contributes: its rows of every tensor, back to back.
  std::vector<int64_t> block(size, 0);
  for (const GatherPiece& p : pieces) {
    for (int r = 0; r < size; ++r) block[r] += p.rows[r] * p.row_bytes;
  }
  const std::vector<int64_t> displs = Offsets(block);

  if (pieces.size() == 1) {  // gather straight into the output
    const GatherPiece& p = pieces[0];
    Activity mpi(ctx, batch, "MPI_ALLGATHER");
    return ctx.mpi.Allgatherv(p.tensor->input, block[me], p.output, block, displs);
  }

  const int64_t total = displs[size - 1] + block[size - 1];
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
    Activity mpi(ctx, batch, "MPI_ALLGATHER");
    Status s = ctx.mpi.Allgatherv(send, block[me], buffer, block, displs);
    if (!s.ok()) return s;
  }
  Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
  std::vector<int64_t> written(pieces.size(), 0);
  for (int r = 0; r < size; ++r) {
    int64_t offset = displs[r];
    for (size_t i = 0; i < pieces.size(); ++i) {
      const int64_t bytes = pieces[i].rows[r] * pieces[i].row_bytes;
      std::memcpy(pieces[i].output + written[i], buffer + offset, bytes);
      written[i] += bytes;
      offset += bytes;
    }
  }
  return Status::OK();
}

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

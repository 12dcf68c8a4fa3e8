// Reducescatter execution: reduce every tensor, rank r keeps its rows.
#include <cstring>

#include "core/collectives.h"
#include "core/reduce_kernels.h"
#include "core/scaling.h"

namespace hvdkeras {

int64_t ScatterRows(int64_t rows, int size, int r) {
  return rows / size + (r < rows % size ? 1 : 0);
}

namespace {

int64_t RowElements(const Shape& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

}  // namespace

Status RunReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const size_t element = DataTypeSize(dtype);
  const int size = ctx.mpi.size();
  const int me = ctx.mpi.rank();
  const int divisor = first.reduce_op == ReduceOp::kAverage ? size : 1;

  struct Piece {
    const TensorRef* tensor;
    int64_t row_elements;
    std::vector<int64_t> rows;   // per rank
    std::vector<int64_t> start;  // first row of each rank's block
    char* output;
  };
  std::vector<Piece> pieces;
  std::vector<int64_t> recv_counts(size, 0);  // elements each rank keeps
  Status allocated;  // the first failed allocation, returned after the exchange
  for (PendingOp* op : batch) {
    for (const TensorRef& ref : op->tensors) {
      Piece p{&ref, RowElements(ref.shape), std::vector<int64_t>(size),
              std::vector<int64_t>(size), nullptr};
      int64_t row = 0;
      for (int r = 0; r < size; ++r) {
        p.rows[r] = ScatterRows(ref.shape[0], size, r);
        p.start[r] = row;
        row += p.rows[r];
        recv_counts[r] += p.rows[r] * p.row_elements;
      }
      Shape out_shape = ref.shape;
      out_shape[0] = p.rows[me];
      void* out = nullptr;
      Status s = ref.allocate_output(out_shape, &out);
      // Note [a failed output allocation still takes part] in collectives.h.
      if (!s.ok() && allocated.ok()) allocated = s;
      p.output = s.ok() ? static_cast<char*>(out) : nullptr;
      pieces.push_back(std::move(p));
    }
  }
  int64_t total = 0;
  for (int64_t c : recv_counts) total += c;

  // Send buffer laid out rank-major: rank 0's rows of every tensor, then
  // rank 1's, ...; the receive buffer holds this rank's rows of every tensor.
  char* buffer = ctx.buffer.Get((total + recv_counts[me]) * element);
  char* recv = buffer + total * element;
  {
    Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
    int64_t offset = 0;
    for (int r = 0; r < size; ++r) {
      for (const Piece& p : pieces) {
        const int64_t n = p.rows[r] * p.row_elements;
        const char* src = static_cast<const char*>(p.tensor->input) +
                          p.start[r] * p.row_elements * element;
        ScaleCopy(dtype, src, buffer + offset * element, n, first.prescale);
        offset += n;
      }
    }
  }
  if (ctx.shm && ctx.shm->HoldsWorld(me) && CanReduce(dtype)) {
    // Note [one summation order on a host] in collectives.h.
    Activity shm(ctx, batch, "SHM_REDUCE_SCATTER");
    auto fill = [&](int64_t b, int64_t e, char* dst) {
      std::memcpy(dst, buffer + b * element, static_cast<size_t>((e - b) * element));
    };
    Status s = ctx.shm->ReduceScatter(recv_counts, recv, dtype, first.reduce_op, 1, 1.0, fill);
    if (!s.ok()) return s;
  } else {
    const bool ring = ctx.mpi.RingTakes(total * static_cast<int64_t>(element), dtype);
    Activity mpi(ctx, batch, ring ? "RING_REDUCE_SCATTER" : "MPI_REDUCE_SCATTER");
    Status s = ctx.mpi.ReduceScatter(buffer, recv, recv_counts, dtype, first.reduce_op);
    if (!s.ok()) return s;
  }
  Activity copy(ctx, batch, "MEMCPY_OUT_FUSION_BUFFER");
  int64_t offset = 0;
  for (const Piece& p : pieces) {
    const int64_t n = p.rows[me] * p.row_elements;
    if (p.output != nullptr) {
      FinalizeCopy(dtype, recv + offset * element, p.output, n, divisor, first.postscale);
    }
    offset += n;
  }
  return allocated;
}

}  // namespace hvdkeras

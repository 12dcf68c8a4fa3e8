// Allreduce execution: a lone tensor in place, or a fused buffer whose
// slices become the outputs (see Note [fused outputs] in block_pool.h).
#include "core/collectives.h"

#include <algorithm>
#include <cstring>

#include "core/scaling.h"

namespace hvdkeras {

namespace {

// Below this, MPI's small-message path beats the shared-memory one here
// (4 KB: 0.39 ms per call through MPI, 0.54 ms through shared memory).
constexpr int64_t kShmMinBytes = int64_t{64} << 10;

// The timeline's name of the exchange: around the ring or MPI's own.
const char* AllreducePhase(const ExecContext& ctx, int64_t bytes, DataType dtype) {
  return ctx.mpi.RingTakes(bytes, dtype) ? "RING_ALLREDUCE" : "MPI_ALLREDUCE";
}

// Allreduce kernels allocate outputs only when the engine asks.
Status EnsureOutput(TensorRef& t) {
  if (t.output) return Status::OK();
  if (!t.allocate_output) {
    return Status::Error(StatusCode::kUnknown, "internal: allreduce tensor without an output");
  }
  return t.allocate_output(t.shape, &t.output);
}

// Writes elements [begin, end) of a fused layout (tensor i's data at byte
// offsets[i], zeros up to the next offset) to dst, prescaled.
void FillFused(const std::vector<TensorRef*>& tensors, const std::vector<int64_t>& offsets,
               int64_t total_bytes, DataType dtype, double prescale, int64_t begin, int64_t end,
               char* dst) {
  const int64_t element = static_cast<int64_t>(DataTypeSize(dtype));
  const int64_t lo = begin * element;
  const int64_t hi = end * element;
  // The last tensor starting at or before lo.
  size_t i = std::upper_bound(offsets.begin(), offsets.end(), lo) - offsets.begin();
  i = i > 0 ? i - 1 : 0;
  for (; i < tensors.size() && offsets[i] < hi; ++i) {
    const int64_t data_end = offsets[i] + TensorBytes(*tensors[i]);
    const int64_t next = i + 1 < offsets.size() ? offsets[i + 1] : total_bytes;
    const int64_t a = std::max(lo, offsets[i]);
    const int64_t b = std::min(hi, data_end);
    if (a < b) {
      ScaleCopy(dtype, static_cast<const char*>(tensors[i]->input) + (a - offsets[i]),
                dst + (a - lo), (b - a) / element, prescale);
    }
    const int64_t pad_a = std::max(lo, data_end);
    const int64_t pad_b = std::min(hi, next);
    if (pad_a < pad_b) std::memset(dst + (pad_a - lo), 0, static_cast<size_t>(pad_b - pad_a));
  }
}

}  // namespace

bool FoldsAtEverySize(const ExecContext& ctx, DataType dtype, ReduceOp op) {
  return ctx.shm != nullptr && ctx.mpi.size() >= 3 && IsFloatingPoint(dtype) &&
         (op == ReduceOp::kSum || op == ReduceOp::kAverage || op == ReduceOp::kProduct) &&
         ctx.shm->HoldsWorld(ctx.mpi.rank());
}

Status RunAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  const Request& first = batch[0]->request;
  const DataType dtype = first.dtypes[0];
  const int divisor = first.reduce_op == ReduceOp::kAverage ? ctx.mpi.size() : 1;
  const size_t element = DataTypeSize(dtype);
  const bool finalize = divisor != 1 || first.postscale != 1.0;

  if (IsSingleTensor(batch)) {
    TensorRef& t = batch[0]->tensors[0];
    const int64_t n = NumElements(t.shape);
    const char* input = static_cast<const char*>(t.input);
    auto fill_single = [&](int64_t b, int64_t e, char* dst) {
      ScaleCopy(dtype, input + b * static_cast<int64_t>(element), dst, e - b, first.prescale);
    };
    const bool shm = ctx.shm && (TensorBytes(t) >= kShmMinBytes ||
                                 FoldsAtEverySize(ctx, dtype, first.reduce_op));
    if (shm) {
      // See Note [shared outputs]: the result stays where it was reduced.
      std::shared_ptr<char> shared;
      {
        Activity activity(ctx, batch, "SHM_ALLREDUCE");
        Status s = ctx.shm->RunShared(n, dtype, first.reduce_op, divisor, first.postscale,
                                      fill_single, !t.output && t.adopt_output, &shared);
        if (!s.ok()) return s;
      }
      if (shared) return t.adopt_output(shared, shared.get());
    }
    // Else the lone tensor is reduced straight into its output: the input
    // itself when nothing else holds it, else a pooled block (reused pages).
    std::shared_ptr<char> block;
    if (!t.output && !(t.reuse_input && t.reuse_input(&t.output)) && t.adopt_output &&
        ctx.blocks) {
      block = ctx.blocks->Acquire(TensorBytes(t));
      t.output = block.get();
    }
    const Status allocated = EnsureOutput(t);
    // Note [a failed output allocation still takes part] in collectives.h.
    char* out = allocated.ok() ? static_cast<char*>(t.output) : ctx.buffer.Get(TensorBytes(t));
    Status s;
    if (shm) {
      Activity activity(ctx, batch, "SHM_ALLREDUCE");
      s = ctx.shm->Run(out, n, dtype, first.reduce_op, divisor, first.postscale, fill_single);
      if (!s.ok()) return s;
    } else {
      const void* send = t.input == out ? nullptr : t.input;
      if (first.prescale != 1.0) {
        Activity scale(ctx, batch, "PRESCALE");
        ScaleCopy(dtype, t.input, out, n, first.prescale);
        send = nullptr;
      }
      // On the ring the scaling goes segment by segment (Note [fused work in
      // the ring] in ring_collectives.cc).
      const bool ring = ctx.mpi.RingTakes(TensorBytes(t), dtype);
      RingStages stages;
      if (ring && finalize) {
        const int64_t el = static_cast<int64_t>(element);
        stages.on_final = [&, el](int64_t b, int64_t e) {
          FinalizeCopy(dtype, out + b, out + b, (e - b) / el, divisor, first.postscale);
        };
      }
      {
        Activity mpi(ctx, batch, AllreducePhase(ctx, TensorBytes(t), dtype));
        s = ctx.mpi.Allreduce(send, out, n, dtype, first.reduce_op, ring ? &stages : nullptr);
        if (!s.ok()) return s;
      }
      if (finalize && !ring) {
        Activity scale(ctx, batch, "POSTSCALE");
        FinalizeCopy(dtype, out, out, n, divisor, first.postscale);
      }
    }
    if (!allocated.ok()) return allocated;
    return block ? t.adopt_output(block, block.get()) : Status::OK();
  }

  // Every tensor starts on a 64-byte boundary (the same layout on every
  // rank); the gaps are zeros and are reduced along with the rest.
  std::vector<TensorRef*> tensors;
  std::vector<int64_t> offsets;
  int64_t total_bytes = 0;
  bool any_adopts = false;
  for (PendingOp* op : batch) {
    for (TensorRef& t : op->tensors) {
      tensors.push_back(&t);
      offsets.push_back(total_bytes);
      total_bytes = AlignUp(total_bytes + TensorBytes(t));
      any_adopts = any_adopts || static_cast<bool>(t.adopt_output);
    }
  }
  auto fill = [&](int64_t b, int64_t e, char* dst) {
    FillFused(tensors, offsets, total_bytes, dtype, first.prescale, b, e, dst);
  };
  const int64_t total = total_bytes / static_cast<int64_t>(element);
  const bool shm = ctx.shm && (total_bytes >= kShmMinBytes ||
                              FoldsAtEverySize(ctx, dtype, first.reduce_op));
  std::shared_ptr<char> block;
  if (shm) {
    // See Note [shared outputs]: the results stay where they were reduced.
    Activity activity(ctx, batch, "SHM_ALLREDUCE");
    Status s = ctx.shm->RunShared(total, dtype, first.reduce_op, divisor, first.postscale, fill,
                                  any_adopts, &block);
    if (!s.ok()) return s;
  }
  const bool shared = static_cast<bool>(block);
  // With outputs that can live in engine memory, the fused buffer becomes
  // their storage: one copy in, none back.
  if (!shared && any_adopts && ctx.blocks) block = ctx.blocks->Acquire(total_bytes);
  char* buffer = block ? block.get() : ctx.buffer.Get(total_bytes);
  if (!shared && shm) {
    // The inputs go straight into shared memory; the results land in buffer.
    Activity activity(ctx, batch, "SHM_ALLREDUCE");
    Status s = ctx.shm->Run(buffer, total, dtype, first.reduce_op, divisor, first.postscale,
                            fill);
    if (!s.ok()) return s;
  } else if (!shared && ctx.mpi.RingTakes(total_bytes, dtype)) {
    // Note [fused work in the ring] in ring_collectives.cc: the copy in and
    // the scaling happen segment by segment while the link works.
    const int64_t el = static_cast<int64_t>(element);
    RingStages stages;
    stages.before_read = [&](int64_t b, int64_t e) { fill(b / el, e / el, buffer + b); };
    if (finalize) {
      stages.on_final = [&](int64_t b, int64_t e) {
        FinalizeCopy(dtype, buffer + b, buffer + b, (e - b) / el, divisor, first.postscale);
      };
    }
    Activity mpi(ctx, batch, AllreducePhase(ctx, total_bytes, dtype));
    Status s = ctx.mpi.Allreduce(nullptr, buffer, total, dtype, first.reduce_op, &stages);
    if (!s.ok()) return s;
  } else if (!shared) {
    {
      Activity copy(ctx, batch, "MEMCPY_IN_FUSION_BUFFER");
      fill(0, total, buffer);
    }
    {
      Activity mpi(ctx, batch, AllreducePhase(ctx, total_bytes, dtype));
      Status s = ctx.mpi.Allreduce(nullptr, buffer, total, dtype, first.reduce_op);
      if (!s.ok()) return s;
    }
    if (finalize) {
      Activity scale(ctx, batch, "POSTSCALE");
      FinalizeCopy(dtype, buffer, buffer, total, divisor, first.postscale);
    }
  }
  Activity copy(ctx, batch, block ? "ADOPT_OUTPUTS" : "MEMCPY_OUT_FUSION_BUFFER");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorRef& t = *tensors[i];
    char* slot = buffer + offsets[i];
    const bool adopt = block && t.adopt_output;
    Status s = adopt ? t.adopt_output(block, slot) : EnsureOutput(t);
    if (!s.ok()) return s;
    if (!adopt) std::memcpy(t.output, slot, TensorBytes(t));
  }
  return Status::OK();
}

}  // namespace hvdkeras

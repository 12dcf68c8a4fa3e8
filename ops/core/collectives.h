// Execution of agreed collectives over MPI, one function per kind. Each runs
// a batch of ops that the fusion planner grouped (same kind and key); ranks
// call them in the same order with matching batches.
#pragma once

#include <string>
#include <vector>

#include "core/block_pool.h"
#include "core/engine_op.h"
#include "core/mpi_context.h"
#include "core/shm_allreduce.h"
#include "core/timeline.h"

namespace hvdkeras {

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
};

// Records an execution phase of every op in a batch on the timeline.
class Activity {
 public:
  Activity(ExecContext& ctx, const std::vector<PendingOp*>& batch, const char* name);
  ~Activity();

 private:
  Timeline* timeline_;
  const std::vector<PendingOp*>& batch_;
};

Status RunAllreduce(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunBroadcast(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunAllgather(ExecContext& ctx, const std::vector<PendingOp*>& batch);
Status RunAlltoall(ExecContext& ctx, PendingOp* op);
Status RunReducescatter(ExecContext& ctx, const std::vector<PendingOp*>& batch);

// Rows of a first dimension of `rows` that rank r receives in reducescatter.
int64_t ScatterRows(int64_t rows, int size, int r);

}  // namespace hvdkeras

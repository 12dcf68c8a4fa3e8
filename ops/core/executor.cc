#include "core/executor.h"

#include <sstream>

#include "core/device_steps.h"
#include "core/fusion_planner.h"

namespace hvdkeras {

namespace {

// The planner must see the same items on every rank, so sizes come from what
// all ranks agreed (an allgather's own contribution differs per rank).
FusionItem FusionItemOf(const PendingOp& op, int size) {
  const Request& r = op.request;
  FusionItem item;
  item.bytes = r.TotalBytes();
  FusionKey& key = item.key;
  key.op_type = r.op_type;
  key.device = r.device;
  switch (r.op_type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      key.dtype = r.dtypes[0];
      key.reduce_op = r.reduce_op;
      key.prescale = r.prescale;
      key.postscale = r.postscale;
      break;
    case OpType::kBroadcast:
      key.dtype = DataType::kUInt8;  // moves raw bytes
      key.root_rank = r.root_rank;
      break;
    case OpType::kAllgather: {
      key.dtype = DataType::kUInt8;
      item.bytes = 0;
      for (size_t t = 0; t < r.shapes.size(); ++t) {
        int64_t row_bytes = static_cast<int64_t>(DataTypeSize(r.dtypes[t]));
        for (size_t d = 1; d < r.shapes[t].size(); ++d) row_bytes *= r.shapes[t][d];
        for (int rank = 0; rank < size; ++rank) {
          item.bytes += op.response->sizes[t * size + rank] * row_bytes;
        }
      }
      break;
    }
    default:  // alltoall, barrier, join
      item.fusable = false;
  }
  return item;
}

std::string TensorArgs(const Request& r) {
  std::ostringstream out;
  out << "{\"dtype\":\"";
  for (size_t i = 0; i < r.dtypes.size(); ++i) out << (i ? "," : "") << DataTypeName(r.dtypes[i]);
  out << "\",\"shape\":\"";
  for (size_t i = 0; i < r.shapes.size(); ++i) out << (i ? "," : "") << ShapeString(r.shapes[i]);
  out << "\"}";
  return out.str();
}

}  // namespace

Status Executor::Open(MpiContext* mpi, const EngineConfig& config, int lane) {
  mpi_ = mpi;
  gpu_.set_lane(lane);
  gpu_.set_wait_seconds(DeviceWaitSeconds(config.stall_shutdown_seconds));
  path_ = AllreducePath::kMpi;
  batches_run_ = 0;
  RingSetting ring_setting = RingSetting::kAuto;
  if (!ParseRingSetting(config.ring_collectives, &ring_setting)) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "ring_collectives must be auto, on or off, not '" +
                             config.ring_collectives + "'");
  }
  Status s = topology_.Open(mpi->comm(), config.shm_allreduce, config.hierarchical_allreduce);
  if (!s.ok()) return s;
  const bool rings = ring_setting != RingSetting::kOff;
  if (rings && mpi->size() > 1) {
    s = ring_.Open(mpi->comm());
    if (!s.ok()) return s;
  }
  mpi->UseRing(&ring_, topology_.layout().hosts, ring_setting, config.ring_min_bytes);
  if (topology_.path() == AllreducePath::kMpi) return Status::OK();
  const MpiContext* cross = nullptr;
  if (topology_.path() == AllreducePath::kHierarchical && topology_.cross() != MPI_COMM_NULL) {
    s = cross_mpi_.Open(topology_.cross());
    if (!s.ok()) return s;
    cross_mpi_.set_allreduce_chunk_bytes(config.allreduce_chunk_bytes);
    if (rings && cross_mpi_.size() > 1) {
      s = cross_ring_.Open(topology_.cross());
      if (!s.ok()) return s;
    }
    // One rank per host: every cross collective crosses hosts. The cross
    // step reduces a slice of one piece at a time (a few hundred KiB), so
    // the size threshold is for whole collectives only: on 3 hosts x 2 ranks
    // MPI's own algorithm took the hierarchical path to 45% of a 1 Gbit/s
    // link, the ring on every piece to 89%.
    cross_mpi_.UseRing(&cross_ring_, cross_mpi_.size(), ring_setting, 0);
    cross = &cross_mpi_;
  }
  s = shm_.Open(topology_.local(), cross, topology_.slices(), config.allreduce_chunk_bytes,
                config.shm_arena_bytes);
  if (!s.ok()) return s;
  // Each host decided about its own window: all must have one, or every
  // rank takes the MPI way, since a hierarchical allreduce needs every host.
  int everywhere = shm_.active() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, mpi->comm());
  if (everywhere) {
    path_ = topology_.path();
  } else {
    shm_.Close(/*collective=*/true);
  }
  return Status::OK();
}

void Executor::Close(bool collective) {
  shm_.Close(collective);
  cross_ring_.Close(collective);
  ring_.Close(collective);
  if (mpi_ != nullptr) mpi_->UseRing(nullptr, 1, RingSetting::kOff, 0);
  cross_mpi_.UseRing(nullptr, 1, RingSetting::kOff, 0);
  cross_mpi_.Close();
  topology_.Close(collective);
  path_ = AllreducePath::kMpi;
  timings_.Clear();
  gpu_.Close(collective);
}

Status Executor::ExecuteDeviceBatch(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  Status s = gpu_.Prepare(*mpi_, batch);
  if (!s.ok()) return s;
  ctx.device = gpu_.device();
  ctx.device_comm = gpu_.communicator();
  ctx.device_lane = gpu_.lane();
  if (time_device_) {
    // The span starts once the inputs are ready (the collective's own
    // WaitForInputs then finds nothing left to wait for).
    s = device_steps::WaitForInputs(ctx, batch);
    if (!s.ok()) {
      FinishFailedDeviceBatch(ctx, batch);
      gpu_.Fail(s);
      return s;
    }
    timings_.Begin(ctx.device, ctx.device_lane);
  }
  switch (batch[0]->request.op_type) {
    case OpType::kAllreduce: s = RunDeviceAllreduce(ctx, batch); break;
    case OpType::kBroadcast: s = RunDeviceBroadcast(ctx, batch); break;
    case OpType::kAllgather: s = RunDeviceAllgather(ctx, batch); break;
    case OpType::kAlltoall: s = RunDeviceAlltoall(ctx, batch[0]); break;
    case OpType::kReducescatter: s = RunDeviceReducescatter(ctx, batch); break;
    default:
      return Status::Error(StatusCode::kInvalidArgument,
                           std::string(OpTypeName(batch[0]->request.op_type)) +
                               " has no GPU version");
  }
  if (s.ok() && time_device_) timings_.End(batch);
  if (!s.ok()) {
    timings_.Abandon();
    FinishFailedDeviceBatch(ctx, batch);
    // Note [a failed GPU batch ends every rank] in device_session.h.
    if (!ctx.device_comm_called) {
      gpu_.Fail(Status::Error(s.code, "'" + batch[0]->request.name + "'" +
                                          (batch.size() > 1 ? " (and " +
                                                                  std::to_string(batch.size() - 1) +
                                                                  " more)"
                                                            : "") +
                                          ": " + s.message));
    }
  }
  return s;
}

void Executor::FinishFailedDeviceBatch(ExecContext& ctx, const std::vector<PendingOp*>& batch) {
  // Work may already be queued on the lane's stream with the batch's
  // buffers: the framework streams wait for it before the ops' done
  // callbacks let the framework reuse those buffers (Note [stream order]);
  // where even that fails, the host waits for the lane's stream. (Ready
  // events never waited for are released by Engine::Finish.)
  if (ctx.device == nullptr) return;
  if (!device_steps::ReleaseStreams(ctx, batch).ok()) {
    ctx.device->Synchronize(ctx.device_lane);
  }
}

Status Executor::DeviceHealth() { return gpu_.Health(); }

const std::string& Executor::DeviceFailure() const { return gpu_.failure_reason(); }

std::vector<Status> Executor::Execute(const std::vector<PendingOp*>& ready,
                                      int64_t fusion_threshold, Timeline* timeline) {
  std::vector<FusionItem> items;
  items.reserve(ready.size());
  for (PendingOp* op : ready) items.push_back(FusionItemOf(*op, mpi_->size()));
  std::vector<Status> statuses(ready.size());
  for (const std::vector<int>& batch_indices : PlanFusion(items, fusion_threshold)) {
    std::vector<PendingOp*> batch;
    for (int i : batch_indices) batch.push_back(ready[i]);
    if (timeline) {
      for (PendingOp* op : batch) {
        timeline->OpStart(op->request.name, op->request.op_type, TensorArgs(op->request));
      }
    }
    const Status s = ExecuteBatch(batch, timeline);
    ++batches_run_;
    if (timeline) {
      for (PendingOp* op : batch) timeline->OpEnd(op->request.name);
    }
    for (int i : batch_indices) statuses[i] = s;
  }
  return statuses;
}

Status Executor::ExecuteBatch(const std::vector<PendingOp*>& batch, Timeline* timeline) {
  ExecContext ctx{*mpi_, fusion_buffer_, timeline, &output_blocks_,
                  shm_.active() ? &shm_ : nullptr};
  if (batch[0]->request.device == DeviceKind::kGpu) return ExecuteDeviceBatch(ctx, batch);
  switch (batch[0]->request.op_type) {
    case OpType::kAllreduce: return RunAllreduce(ctx, batch);
    case OpType::kBroadcast: return RunBroadcast(ctx, batch);
    case OpType::kAllgather: return RunAllgather(ctx, batch);
    case OpType::kAlltoall: return RunAlltoall(ctx, batch[0]);
    case OpType::kReducescatter: return RunReducescatter(ctx, batch);
    case OpType::kBarrier: return Status::OK();  // agreement itself was the barrier
    case OpType::kJoin:
      if (batch[0]->join_result) *batch[0]->join_result = batch[0]->response->last_joined_rank;
      return Status::OK();
  }
  return Status::Error(StatusCode::kUnknown, "unknown op type");
}

}  // namespace hvdkeras

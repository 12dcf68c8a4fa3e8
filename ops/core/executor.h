// Execution of what the ranks agreed on: the fusion plan of a cycle's ready
// ops and the dispatch of each batch to its collective, on the CPU or on the
// GPU. Owns what the collectives work with: the fusion buffer, the pool of
// blocks that fused allreduce results are handed out in (see Note [fused
// outputs] in block_pool.h), the hosts' layout and the allreduce path it
// chooses (host_topology.h), the shared-memory window, and the GPU session
// (device_session.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/block_pool.h"
#include "core/collectives.h"
#include "core/device_session.h"
#include "core/device_timing.h"
#include "core/engine_settings.h"
#include "core/host_topology.h"
#include "core/mpi_context.h"
#include "core/pending_op.h"
#include "core/ring_collectives.h"
#include "core/shm_allreduce.h"
#include "core/timeline.h"

namespace hvdkeras {

class Executor {
 public:
  // Collective (the shared-memory window and the rings are made by all
  // ranks together). `lane` is the engine's process set id (Note [device
  // lanes] in device.h). Large collectives of `mpi` go around a ring where
  // the settings and the hosts say so (Note [ring across hosts]).
  Status Open(MpiContext* mpi, const EngineConfig& config, int lane);
  // `collective` false only forgets the window (after a failure, when the
  // other ranks may not get here).
  void Close(bool collective);

  // Batches executed since Open.
  int64_t batches_run() const { return batches_run_; }

  // The way large CPU allreduces go (fixed at Open).
  AllreducePath allreduce_path() const { return path_; }

  // OK, or the error the GPU communicator met on its own (device_session.h).
  Status DeviceHealth();
  // Why this rank's GPU collectives stopped ("" while they have not): Note
  // [a failed GPU batch ends every rank] in device_session.h.
  const std::string& DeviceFailure() const;

  // Whether GPU batches are timed on the device (Note [device time] in
  // device.h): while tracing or autotuning.
  void set_time_device(bool on) { time_device_ = on; }
  // The GPU batches the device has finished since the last call.
  std::vector<DeviceSpan> TakeDeviceSpans() { return timings_.TakeFinished(); }

  // Runs `ready` in order, fused into batches of at most `fusion_threshold`
  // bytes; returns one status per op. `timeline` is null unless tracing.
  std::vector<Status> Execute(const std::vector<PendingOp*>& ready, int64_t fusion_threshold,
                              Timeline* timeline);

 private:
  Status ExecuteBatch(const std::vector<PendingOp*>& batch, Timeline* timeline);
  Status ExecuteDeviceBatch(ExecContext& ctx, const std::vector<PendingOp*>& batch);
  void FinishFailedDeviceBatch(ExecContext& ctx, const std::vector<PendingOp*>& batch);

  MpiContext* mpi_ = nullptr;
  FusionBuffer fusion_buffer_;
  // Fused allreduce results handed out as outputs; up to 256 MiB of released
  // blocks are kept for the next steps.
  BlockPool output_blocks_{int64_t{256} << 20};
  int64_t batches_run_ = 0;
  HostTopology topology_;
  AllreducePath path_ = AllreducePath::kMpi;
  MpiContext cross_mpi_;  // the cross step of the hierarchical allreduce
  RingCollectives ring_;        // over all of mpi_'s ranks
  RingCollectives cross_ring_;  // over cross_mpi_'s ranks
  ShmAllreduce shm_;
  DeviceSession gpu_;
  bool time_device_ = false;
  DeviceTimings timings_;
};

}  // namespace hvdkeras

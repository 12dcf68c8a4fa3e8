// The GPU side of an engine's session: the device, this engine's lane on it
// (Note [device lanes] in device.h) and the communicator of all ranks' GPUs,
// set up by every rank together at their first GPU batch (CPU-only jobs
// never touch the GPU libraries), the check that each rank keeps to one GPU
// of its own, and the communicator's health.
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/mpi_context.h"
#include "core/pending_op.h"

namespace hvdkeras {

class DeviceSession {
 public:
  DeviceSession() = default;
  // A session still open when the process exits (no shutdown() ran) lets its
  // communicator go unfinished: by then the GPU libraries may be unloaded.
  ~DeviceSession() { comm_.release(); }
  DeviceSession(const DeviceSession&) = delete;
  DeviceSession& operator=(const DeviceSession&) = delete;

  // The engine's lane id (its process set id), before the first batch.
  void set_lane(int lane) { lane_ = lane; }

  // Collective at the first GPU batch (every rank reaches it in the agreed
  // order): finds the device, readies this lane on it and makes the
  // communicator, or fails on every rank with the reason. Later batches only
  // check their GPU.
  Status Prepare(const MpiContext& mpi, const std::vector<PendingOp*>& batch);
  // Ends the communicator; without `collective` (after a failure) it does not
  // wait for the other ranks.
  void Close(bool collective);
  // OK, or the error the communicator met on its own (a lost peer); on an
  // error the communicator is aborted and the session closed. No wait.
  Status Health();

  Device* device() const { return device_; }
  DeviceCommunicator* communicator() const { return comm_.get(); }
  DeviceLane lane() const { return {ordinal_, lane_}; }

 private:
  Status Start(const MpiContext& mpi, int ordinal);

  Device* device_ = nullptr;  // process-wide, owned by the device backend
  std::unique_ptr<DeviceCommunicator> comm_;
  int ordinal_ = -1;
  int lane_ = 0;
};

}  // namespace hvdkeras

// The GPU side of an engine's session: the device and the communicator of
// all ranks' GPUs, set up by every rank together at their first GPU batch
// (CPU-only jobs never touch the GPU libraries), and the check that each
// rank keeps to one GPU of its own.
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

  // Collective at the first GPU batch (every rank reaches it in the agreed
  // order): finds the device and makes the communicator, or fails on every
  // rank with the reason. Later batches only check their GPU.
  Status Prepare(const MpiContext& mpi, const std::vector<PendingOp*>& batch);
  // Ends the communicator; without `collective` (after a failure) it does not
  // wait for the other ranks.
  void Close(bool collective);

  Device* device() const { return device_; }
  DeviceCommunicator* communicator() const { return comm_.get(); }
  int ordinal() const { return ordinal_; }

 private:
  Status Start(const MpiContext& mpi, int ordinal);

  Device* device_ = nullptr;  // process-wide, owned by the device backend
  std::unique_ptr<DeviceCommunicator> comm_;
  int ordinal_ = -1;
};

}  // namespace hvdkeras

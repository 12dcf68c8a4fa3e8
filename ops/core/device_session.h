// The GPU side of an engine's session: the device, this engine's lane on it
// (Note [device lanes] in device.h) and the communicator of all ranks' GPUs,
// set up by every rank together at their first GPU batch (CPU-only jobs
// never touch the GPU libraries), the check that each rank keeps to one GPU
// of its own, and the communicator's health.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/mpi_context.h"
#include "core/pending_op.h"

namespace hvdkeras {

// Note [a failed GPU batch ends every rank]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank's communicator must see the same calls in the same order. A
// GPU batch that fails on one rank before its communicator call (scratch
// growth out of memory, a kernel launch, the call itself, a peer that
// never connected) leaves that rank one call behind: the others' kernels
// wait for it, and its next call would pair with their previous one (a
// wrong sum when the sizes match, a hang when they do not). So the session
// keeps the reason and no later GPU batch of this engine runs; the rank
// waits, within a bound, for what it queued before (batches every rank was
// told are done), and does not abort its communicator alone: an abort can
// need every rank of the communicator, and one blocked in it would never
// reach the negotiation that stops the others, nor may it cut short an
// earlier batch the others already count as done. The engine reports the
// failure in its next negotiation (a status bit and then every rank's
// reason, negotiation.cc), and every rank ends its engine with an error
// naming the failed ranks and aborts its own communicator (Close without
// `collective`), all at the same point, which frees the kernels still
// waiting. A failure after the call (the average's scaling, copying
// out) or an output the framework could not allocate (Note [a failed output
// allocation still takes part] in collectives.h) keeps the calls in step
// and fails only that batch.

// Note [GPU checks are agreed]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What one rank checks about its own batch (all tensors on one GPU, the
// same GPU as before) must not let that rank skip a step the others take.
// At the first GPU batch every rank enters Start's exchanges, a rank whose
// batch failed its check included: its reason travels in its identity
// record, so every rank refuses the batch naming the same ranks and
// reasons, and no communicator is made. After that, a failed check goes
// through Fail: the others are already in the batch's communicator call,
// and only the agreed stop frees them (Note [a failed GPU batch ends every
// rank]). The fusion key carries the device kind, not the GPU: the ordinal
// is one rank's own fact, and fusing by it would plan different batches on
// different ranks; a batch that mixes GPUs fails its check instead.

// How long one communicator call may wait for its peers: kDeviceWaitSeconds
// in core/device.h, or the stall bound where that is lower.
inline double DeviceWaitSeconds(double stall_shutdown_seconds) {
  return stall_shutdown_seconds > 0 && stall_shutdown_seconds < kDeviceWaitSeconds
             ? stall_shutdown_seconds
             : kDeviceWaitSeconds;
}

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
  // The longest a communicator call may wait on the host for its peers
  // (Note [bounded NCCL calls] in ops/cuda; 0: no bound), before the first
  // batch.
  void set_wait_seconds(double seconds) { wait_seconds_ = seconds; }

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
  // A batch failed with its communicator calls out of step with the other
  // ranks': refuses every later batch and drains what was queued before,
  // within kDeviceWaitSeconds; the communicator is aborted by the agreed
  // stop (Close), on every rank together (Note [a failed GPU batch ends
  // every rank]). The first reason is kept.
  void Fail(const Status& why);
  // OK, or why this rank's GPU collectives stopped (Fail), and the
  // failure itself ("" when none), for the other ranks.
  const Status& failure() const { return failure_; }
  const std::string& failure_reason() const { return failure_reason_; }

  Device* device() const { return device_; }
  DeviceCommunicator* communicator() const { return comm_.get(); }
  DeviceLane lane() const { return {ordinal_, lane_}; }

 private:
  // `checked`: this rank's own check of the first batch (one GPU per
  // batch), which the agreement covers with the rest.
  Status Start(const MpiContext& mpi, int ordinal, const Status& checked);
  // Ends the communicator (aborted, or finished in order) and unregisters
  // its lane from the GPU.
  void EndCommunicator(bool abort);

  Device* device_ = nullptr;  // process-wide, owned by the device backend
  std::unique_ptr<DeviceCommunicator> comm_;
  int ordinal_ = -1;
  int lane_ = 0;
  double wait_seconds_ = 0.0;
  Status failure_;
  std::string failure_reason_;
};

}  // namespace hvdkeras

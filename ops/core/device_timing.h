// GPU batches timed on the device (Note [device time] in device.h): marks
// around each batch's work on its lane, read back once the GPU has passed
// them, for the timeline's GPU spans and the autotuner's throughput.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/pending_op.h"

namespace hvdkeras {

// One GPU batch as the device ran it.
struct DeviceSpan {
  std::vector<std::string> names;
  OpType op = OpType::kAllreduce;
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point start, end;
};

class DeviceTimings {
 public:
  DeviceTimings() = default;
  ~DeviceTimings() { Clear(); }
  DeviceTimings(const DeviceTimings&) = delete;
  DeviceTimings& operator=(const DeviceTimings&) = delete;

  // Engine thread, around one batch's device work: Begin before it (after
  // the inputs' ready events), End after it succeeded; Abandon after it
  // failed. A mark that cannot be made only leaves the batch untimed.
  void Begin(Device* device, const DeviceLane& lane);
  void End(const std::vector<PendingOp*>& batch);
  void Abandon();
  // The spans the GPU has finished, in the order they ran (each once).
  std::vector<DeviceSpan> TakeFinished();
  // Drops every mark (the lane is going away).
  void Clear();

 private:
  struct Pending {
    Device* device = nullptr;
    void* start = nullptr;
    void* end = nullptr;
    DeviceSpan span;
  };
  Device* device_ = nullptr;
  DeviceLane lane_;
  void* start_ = nullptr;
  std::deque<Pending> pending_;
};

}  // namespace hvdkeras

#include "core/device_timing.h"

namespace hvdkeras {

void DeviceTimings::Begin(Device* device, const DeviceLane& lane) {
  Abandon();
  void* mark = nullptr;
  if (device == nullptr || !device->MarkTime(lane, &mark).ok()) return;
  device_ = device;
  lane_ = lane;
  start_ = mark;
}

void DeviceTimings::End(const std::vector<PendingOp*>& batch) {
  if (start_ == nullptr) return;
  void* end = nullptr;
  if (!device_->MarkTime(lane_, &end).ok()) {
    Abandon();
    return;
  }
  Pending p;
  p.device = device_;
  p.start = start_;
  p.end = end;
  p.span.op = batch[0]->request.op_type;
  for (const PendingOp* op : batch) {
    p.span.names.push_back(op->request.name);
    p.span.bytes += op->request.TotalBytes();
  }
  start_ = nullptr;
  pending_.push_back(std::move(p));
}

void DeviceTimings::Abandon() {
  if (start_ != nullptr) device_->ReleaseMark(start_);
  start_ = nullptr;
}

std::vector<DeviceSpan> DeviceTimings::TakeFinished() {
  std::vector<DeviceSpan> finished;
  // One lane's stream runs its batches in order: the first unfinished one
  // ends the scan.
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    bool started = false, ended = false;
    if (!p.device->MarkedTime(p.end, &ended, &p.span.end).ok()) ended = true;  // dropped below
    if (!ended) break;
    if (!p.device->MarkedTime(p.start, &started, &p.span.start).ok() || !started ||
        p.span.end < p.span.start) {
      p.span.bytes = -1;  // unreadable: dropped
    }
    p.device->ReleaseMark(p.start);
    p.device->ReleaseMark(p.end);
    if (p.span.bytes >= 0) finished.push_back(std::move(p.span));
    pending_.pop_front();
  }
  return finished;
}

void DeviceTimings::Clear() {
  Abandon();
  for (Pending& p : pending_) {
    p.device->ReleaseMark(p.start);
    p.device->ReleaseMark(p.end);
  }
  pending_.clear();
}

}  // namespace hvdkeras

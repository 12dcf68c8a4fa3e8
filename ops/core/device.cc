#include "core/device.h"

#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "core/pending_op.h"

namespace hvdkeras {

namespace {

DeviceBackend& Registered() {
  static DeviceBackend backend;
  return backend;
}

std::atomic<int> pinned_device{-1};
std::atomic<int> last_used_device{-1};

}  // namespace

void RegisterDeviceBackend(const DeviceBackend& backend) { Registered() = backend; }

const DeviceBackend* GetDeviceBackend() {
  return Registered().device != nullptr ? &Registered() : nullptr;
}

void SetPinnedDevice(int device) { pinned_device.store(device); }

int PinnedDevice() { return pinned_device.load(); }

void NoteDeviceUsed(int device) {
  if (device >= 0) last_used_device.store(device, std::memory_order_relaxed);
}

int DefaultDevice() {
  const int pinned = pinned_device.load();
  if (pinned >= 0) return pinned;
  const int used = last_used_device.load();
  return used >= 0 ? used : 0;
}

namespace {
std::mutex lanes_mu;
std::map<int, std::set<int>>& CommunicatorLanes() {
  static auto* lanes = new std::map<int, std::set<int>>();  // outlives every engine
  return *lanes;
}
}  // namespace

std::vector<int> AddCommunicatorLane(int device, int lane) {
  std::lock_guard<std::mutex> lock(lanes_mu);
  std::set<int>& on_gpu = CommunicatorLanes()[device];
  std::vector<int> others;
  for (int other : on_gpu) {
    if (other != lane) others.push_back(other);
  }
  on_gpu.insert(lane);
  return others;
}

void RemoveCommunicatorLane(int device, int lane) {
  std::lock_guard<std::mutex> lock(lanes_mu);
  CommunicatorLanes()[device].erase(lane);
}

void DiscardReadyEvents(PendingOp* op) {
  Device* device = nullptr;
  for (TensorRef& t : op->tensors) {
    if (t.ready == nullptr) continue;
    if (device == nullptr) {
      std::string why;
      const DeviceBackend* backend = GetDeviceBackend();
      device = backend ? backend->device(&why) : nullptr;
    }
    if (device != nullptr) device->Discard(t.ready);
    t.ready = nullptr;
  }
}

}  // namespace hvdkeras

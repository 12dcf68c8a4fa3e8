#include "core/device.h"

#include <atomic>

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

#include "core/burst_memory.h"

namespace hvdkeras {

void BurstMemory::Remember(const std::vector<std::string>& names) {
  if (names.empty()) return;
  if (SameAsRemembered(names)) return;  // the usual step: nothing to allocate
  auto burst = std::make_shared<Burst>();
  burst->size = names.size();
  // Bursts of earlier cycles that lose members shrink with them, so that a
  // name moving to a new burst is no longer waited for by its old one.
  for (const std::string& name : names) {
    auto it = burst_of_.find(name);
    if (it != burst_of_.end()) {
      if (it->second->size > 0) --it->second->size;
      it->second = burst;
    } else {
      burst_of_.emplace(name, burst);
    }
  }
}

bool BurstMemory::SameAsRemembered(const std::vector<std::string>& names) const {
  const Burst* first = nullptr;
  for (const std::string& name : names) {
    auto it = burst_of_.find(name);
    if (it == burst_of_.end()) return false;
    if (first == nullptr) first = it->second.get();
    if (it->second.get() != first) return false;
  }
  // Distinct names (agreed ops are) all in one burst of their number: it is this one.
  return first->size == names.size();
}

void BurstMemory::BeginCount() {
  ++epoch_;
  missing_ = 0;
}

void BurstMemory::Count(const std::string& name) {
  auto it = burst_of_.find(name);
  if (it == burst_of_.end()) return;
  Burst& burst = *it->second;
  if (burst.count_epoch != epoch_) {
    burst.count_epoch = epoch_;
    burst.counted = 0;
  }
  if (burst.counted >= burst.size) return;  // counted twice: nothing more to wait for
  ++burst.counted;
  if (burst.counted == 1) {
    missing_ += burst.size - 1;
  } else {
    --missing_;
  }
}

}  // namespace hvdkeras

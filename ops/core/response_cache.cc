#include "core/response_cache.h"

#include <algorithm>
#include <atomic>
#include <functional>

namespace hvdkeras {

ResponseCache::ResponseCache(size_t capacity) : capacity_(capacity) {
  // Each cache hands out versions from its own range, so an op that still
  // holds a (slot, version) from an earlier cache can never match this one
  // (Note [classified once]).
  static std::atomic<uint64_t> next_range{1};
  changes_ = next_range.fetch_add(1) << 40;
}

int ResponseCache::Lookup(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void ResponseCache::Put(const Request& signature, std::shared_ptr<const Response> response) {
  if (capacity_ == 0) return;
  int slot = Lookup(signature.name);
  if (slot >= 0) {
    slots_[slot].signature = signature;
    slots_[slot].response = std::move(response);
    slots_[slot].version = ++changes_;
    Touch(slot);
    return;
  }
  if (by_name_.size() >= capacity_) {
    Erase(lru_.back());
    ++evictions_;
  }
  slot = AllocateSlot();
  Slot& s = slots_[slot];
  s.used = true;
  s.version = ++changes_;
  s.signature = signature;
  s.response = std::move(response);
  lru_.push_front(slot);
  s.lru_position = lru_.begin();
  by_name_[signature.name] = slot;
}

void ResponseCache::Touch(int slot) {
  Slot& s = slots_[slot];
  lru_.splice(lru_.begin(), lru_, s.lru_position);
  s.lru_position = lru_.begin();
}

void ResponseCache::Erase(int slot) {
  Slot& s = slots_[slot];
  if (!s.used) return;
  by_name_.erase(s.signature.name);
  lru_.erase(s.lru_position);
  s.used = false;
  s.version = ++changes_;
  s.signature = Request();
  s.response = std::make_shared<const Response>();
  free_slots_.push_back(slot);
  std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<int>());
}

int ResponseCache::AllocateSlot() {
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<int>());
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  slots_.emplace_back();
  return static_cast<int>(slots_.size()) - 1;
}

}  // namespace hvdkeras

#include "core/range_allocator.h"

#include <iterator>

namespace hvdkeras {

RangeAllocator::RangeAllocator(int64_t capacity)
    : capacity_(capacity > 0 ? capacity : 0), free_bytes_(capacity_) {
  if (capacity_ > 0) free_[0] = capacity_;
}

int64_t RangeAllocator::Allocate(int64_t bytes) {
  if (bytes <= 0) return -1;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const int64_t offset = it->first;
    const int64_t rest = it->second - bytes;
    free_.erase(it);
    if (rest > 0) free_[offset + bytes] = rest;
    free_bytes_ -= bytes;
    return offset;
  }
  return -1;
}

void RangeAllocator::Free(int64_t offset, int64_t bytes) {
  if (bytes <= 0) return;
  free_bytes_ += bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      previous->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

}  // namespace hvdkeras

// First-fit allocation of byte ranges inside one fixed region, with freed
// neighbours merged again. Pure: the shared-memory arena (shm_arena.h) keeps
// its blocks with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace hvdkeras {

class RangeAllocator {
 public:
  explicit RangeAllocator(int64_t capacity);

  // The offset of `bytes` free bytes (rounded up to kBlockAlignment's
  // multiple by the caller), or -1 when no free range is that long.
  int64_t Allocate(int64_t bytes);
  // Returns a range that Allocate handed out.
  void Free(int64_t offset, int64_t bytes);

  int64_t capacity() const { return capacity_; }
  int64_t free_bytes() const { return free_bytes_; }
  // Free ranges (merged ones count once; for tests).
  size_t free_ranges() const { return free_.size(); }

 private:
  int64_t capacity_;
  int64_t free_bytes_;
  std::map<int64_t, int64_t> free_;  // offset -> length
};

}  // namespace hvdkeras

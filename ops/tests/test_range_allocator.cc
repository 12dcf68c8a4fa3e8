// Unit tests of the range allocator (core/range_allocator.cc) behind the
// shared-memory arena: first fit, exhaustion, and merging on free.
#include <cstdint>

#include "core/range_allocator.h"
#include "tests/harness.h"

namespace {

TEST(RangesFirstFitAndExhaustion) {
  hvdkeras::RangeAllocator ranges(1000);
  CHECK_EQ(ranges.Allocate(400), int64_t{0});
  CHECK_EQ(ranges.Allocate(400), int64_t{400});
  CHECK_EQ(ranges.Allocate(400), int64_t{-1});  // 200 left
  CHECK_EQ(ranges.Allocate(200), int64_t{800});
  CHECK_EQ(ranges.free_bytes(), int64_t{0});
  CHECK_EQ(ranges.Allocate(1), int64_t{-1});
  CHECK_EQ(ranges.Allocate(0), int64_t{-1});
}

TEST(RangesMergeWithBothNeighbours) {
  hvdkeras::RangeAllocator ranges(300);
  const int64_t a = ranges.Allocate(100);
  const int64_t b = ranges.Allocate(100);
  const int64_t c = ranges.Allocate(100);
  ranges.Free(a, 100);
  ranges.Free(c, 100);
  CHECK_EQ(ranges.free_ranges(), size_t{2});
  CHECK_EQ(ranges.Allocate(200), int64_t{-1});  // free, but not in one piece
  ranges.Free(b, 100);
  CHECK_EQ(ranges.free_ranges(), size_t{1});
  CHECK_EQ(ranges.free_bytes(), int64_t{300});
  CHECK_EQ(ranges.Allocate(300), int64_t{0});
}

TEST(RangesReuseTheFirstHoleThatFits) {
  hvdkeras::RangeAllocator ranges(1000);
  const int64_t a = ranges.Allocate(100);
  ranges.Allocate(100);
  const int64_t c = ranges.Allocate(300);
  ranges.Allocate(100);
  ranges.Free(a, 100);
  ranges.Free(c, 300);
  CHECK_EQ(ranges.Allocate(200), c);   // the 100-byte hole at 0 is too short
  CHECK_EQ(ranges.Allocate(100), a);
  CHECK_EQ(ranges.free_bytes(), int64_t{1000 - 100 - 100 - 200 - 100});  // a, b, c, d
}

TEST(RangesEmptyRegion) {
  hvdkeras::RangeAllocator ranges(0);
  CHECK_EQ(ranges.Allocate(64), int64_t{-1});
  CHECK_EQ(ranges.free_ranges(), size_t{0});
}

}  // namespace

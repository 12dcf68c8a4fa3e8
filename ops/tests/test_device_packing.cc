// Unit tests of the device packing plan (core/device_packing.cc): offsets at
// the alignment, the buffer's size, and how copies are grouped into batched
// launches, over odd sizes and alignments. No GPU needed.
#include <cstdint>
#include <utility>
#include <vector>

#include "core/device_packing.h"
#include "tests/harness.h"

namespace {

using hvdkeras::PackingPlan;
using hvdkeras::PlanPacking;
using Launches = std::vector<std::pair<size_t, size_t>>;
using test_harness::Lcg;

TEST(EmptyListHasNothing) {
  const PackingPlan plan = PlanPacking({}, 256, 4);
  CHECK_EQ(plan.offsets, std::vector<int64_t>{});
  CHECK_EQ(plan.total_bytes, int64_t{0});
  CHECK(plan.launches.empty());
}

TEST(OffsetsStartAtTheAlignment) {
  const PackingPlan plan = PlanPacking({4, 256, 257, 1, 0, 3}, 256, 64);
  CHECK_EQ(plan.offsets, (std::vector<int64_t>{0, 256, 512, 1024, 1280, 1280}));
  CHECK_EQ(plan.total_bytes, int64_t{1536});
  CHECK_EQ(plan.launches.size(), size_t{1});
  CHECK(plan.launches[0] == std::make_pair(size_t{0}, size_t{6}));
}

TEST(AlignmentOfOneLaysTensorsEndToEnd) {
  const PackingPlan plan = PlanPacking({3, 5, 7}, 1, 64);
  CHECK_EQ(plan.offsets, (std::vector<int64_t>{0, 3, 8}));
  CHECK_EQ(plan.total_bytes, int64_t{15});
}

TEST(LaunchesHoldAtMostTheLimit) {
  const PackingPlan plan = PlanPacking(std::vector<int64_t>(10, 8), 8, 4);
  CHECK(plan.launches == (Launches{{0, 4}, {4, 8}, {8, 10}}));
}

TEST(EmptyTensorsAreNotCopiesAndNeverStartALaunch) {
  // Data at 1, 3, 4, 6; the limit of 2 copies per launch counts data only.
  const PackingPlan plan = PlanPacking({0, 8, 0, 8, 8, 0, 8, 0}, 8, 2);
  CHECK(plan.launches == (Launches{{1, 4}, {4, 8}}));
  CHECK(PlanPacking({0, 0}, 8, 2).launches.empty());
}

// Randomized: every byte of every tensor lies in the buffer, tensors do not
// overlap, offsets are aligned, and every data tensor is in exactly one
// launch of at most the limit.
TEST(RandomPlansKeepTheirPromises) {
  Lcg rng(7);
  for (int round = 0; round < 2000; ++round) {
    const int n = rng.Below(40);
    const int64_t alignment = int64_t{1} << rng.Below(9);
    const int limit = 1 + rng.Below(8);
    std::vector<int64_t> bytes;
    for (int i = 0; i < n; ++i) bytes.push_back(rng.Below(4) == 0 ? 0 : rng.Below(3000));
    const PackingPlan plan = PlanPacking(bytes, alignment, limit);
    CHECK_EQ(plan.offsets.size(), bytes.size());
    int64_t previous_end = 0;
    for (int i = 0; i < n; ++i) {
      CHECK(plan.offsets[i] % alignment == 0);
      CHECK(plan.offsets[i] >= previous_end);
      previous_end = plan.offsets[i] + bytes[i];
      CHECK(previous_end <= plan.total_bytes);
    }
    CHECK(plan.total_bytes % alignment == 0);
    std::vector<int> launches_of(n, 0);
    size_t expected_begin = 0;
    for (const auto& [first, end] : plan.launches) {
      CHECK(first < end && end <= bytes.size());
      CHECK(bytes[first] > 0);
      CHECK(first >= expected_begin);
      expected_begin = end;
      int copies = 0;
      for (size_t i = first; i < end; ++i) {
        if (bytes[i] > 0) {
          ++copies;
          ++launches_of[i];
        }
      }
      CHECK(copies >= 1 && copies <= limit);
    }
    for (int i = 0; i < n; ++i) CHECK_EQ(launches_of[i], bytes[i] > 0 ? 1 : 0);
  }
}

}  // namespace

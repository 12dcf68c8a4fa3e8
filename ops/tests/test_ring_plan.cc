// Unit tests of the ring schedule (core/ring_plan.cc): every rank's sends
// pair with its right neighbour's receives segment for segment, a simulated
// run of every rank's schedule gives each rank the right blocks, and the
// choice of when the ring runs (Note [ring across hosts]).
#include <cstdint>
#include <vector>

#include "core/ring_plan.h"
#include "tests/harness.h"

namespace {

using hvdkeras::PlanRing;
using hvdkeras::RingKind;
using hvdkeras::RingSchedule;
using hvdkeras::RingSegment;

// Byte sizes of `elements` int64 elements cut into `size` blocks.
std::vector<int64_t> Blocks(int64_t elements, int size) {
  std::vector<int64_t> blocks(size);
  for (int r = 0; r < size; ++r) {
    blocks[r] = 8 * (elements * (r + 1) / size - elements * r / size);
  }
  return blocks;
}

// Runs every rank's schedule on int64 elements in lockstep order (a receive
// is taken once the sender has sent it), as MPI would deliver them.
std::vector<std::vector<int64_t>> Simulate(RingKind kind, const std::vector<int64_t>& blocks,
                                           int64_t segment,
                                           std::vector<std::vector<int64_t>> data) {
  const int size = static_cast<int>(blocks.size());
  std::vector<RingSchedule> plans;
  for (int r = 0; r < size; ++r) plans.push_back(PlanRing(kind, r, size, blocks, 8, segment));
  // What each rank has sent so far, as copies (the send reads the buffer
  // when it is posted; the schedule only sends finished segments).
  std::vector<std::vector<std::vector<int64_t>>> wire(size);
  std::vector<size_t> posted(size, 0), taken(size, 0);
  auto post_ready = [&](int r) {
    const RingSchedule& p = plans[r];
    while (posted[r] < p.sends.size() &&
           static_cast<int64_t>(posted[r]) < p.ready_sends + static_cast<int64_t>(taken[r])) {
      const RingSegment& s = p.sends[posted[r]++];
      wire[r].emplace_back(data[r].begin() + s.offset / 8,
                           data[r].begin() + (s.offset + s.bytes) / 8);
    }
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < size; ++r) {
      post_ready(r);
      const int left = (r + size - 1) % size;
      while (taken[r] < plans[r].recvs.size() && taken[r] < wire[left].size()) {
        const RingSegment& s = plans[r].recvs[taken[r]];
        const std::vector<int64_t>& got = wire[left][taken[r]];
        CHECK_EQ(static_cast<int64_t>(got.size()) * 8, s.bytes);
        for (size_t i = 0; i < got.size(); ++i) {
          int64_t& at = data[r][s.offset / 8 + i];
          at = s.reduce ? at + got[i] : got[i];
        }
        ++taken[r];
        moved = true;
        post_ready(r);
      }
    }
  }
  for (int r = 0; r < size; ++r) {
    CHECK_EQ(taken[r], plans[r].recvs.size());
    CHECK_EQ(posted[r], plans[r].sends.size());
  }
  return data;
}

std::vector<std::vector<int64_t>> Contributions(int size, int64_t elements) {
  std::vector<std::vector<int64_t>> data(size, std::vector<int64_t>(elements));
  for (int r = 0; r < size; ++r) {
    for (int64_t i = 0; i < elements; ++i) data[r][i] = (r + 1) * 1000003 + i * (r + 7);
  }
  return data;
}

int64_t SumAt(const std::vector<std::vector<int64_t>>& data, int64_t i) {
  int64_t sum = 0;
  for (const auto& rank : data) sum += rank[i];
  return sum;
}

TEST(SendsPairWithTheRightNeighboursReceives) {
  for (RingKind kind : {RingKind::kAllreduce, RingKind::kReduceScatter, RingKind::kAllgather}) {
    for (int size : {2, 3, 4, 5, 7}) {
      const std::vector<int64_t> blocks = Blocks(1001, size);
      for (int r = 0; r < size; ++r) {
        const RingSchedule mine = PlanRing(kind, r, size, blocks, 8, 80);
        const RingSchedule next = PlanRing(kind, (r + 1) % size, size, blocks, 8, 80);
        CHECK_EQ(mine.sends.size(), next.recvs.size());
        for (size_t i = 0; i < mine.sends.size(); ++i) {
          CHECK_EQ(mine.sends[i].offset, next.recvs[i].offset);
          CHECK_EQ(mine.sends[i].bytes, next.recvs[i].bytes);
        }
      }
    }
  }
}

TEST(AllreduceGivesEveryRankTheSumAtEveryRankCount) {
  for (int size : {2, 3, 4, 5, 8}) {
    for (int64_t elements : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      const auto start = Contributions(size, elements);
      const auto done =
          Simulate(RingKind::kAllreduce, Blocks(elements, size), 8 * 13, start);
      for (int r = 0; r < size; ++r) {
        for (int64_t i = 0; i < elements; ++i) CHECK_EQ(done[r][i], SumAt(start, i));
      }
    }
  }
}

TEST(ReduceScatterLeavesBlockROnRankRWithUnevenAndEmptyBlocks) {
  const std::vector<int64_t> blocks = {8 * 5, 0, 8 * 300, 8 * 1};
  const auto start = Contributions(4, 306);
  const auto done = Simulate(RingKind::kReduceScatter, blocks, 8 * 16, start);
  int64_t at = 0;
  for (int r = 0; r < 4; ++r) {
    for (int64_t i = at; i < at + blocks[r] / 8; ++i) CHECK_EQ(done[r][i], SumAt(start, i));
    at += blocks[r] / 8;
  }
}

TEST(AllgatherCopiesEveryRanksBlock) {
  const std::vector<int64_t> blocks = {8 * 3, 8 * 40, 0, 8 * 9, 8 * 2};
  auto start = Contributions(5, 54);
  const auto done = Simulate(RingKind::kAllgather, blocks, 8 * 4, start);
  int64_t at = 0;
  for (int owner = 0; owner < 5; ++owner) {
    for (int64_t i = at; i < at + blocks[owner] / 8; ++i) {
      for (int r = 0; r < 5; ++r) CHECK_EQ(done[r][i], start[owner][i]);
    }
    at += blocks[owner] / 8;
  }
}

TEST(SegmentsAreWholeElements) {
  const RingSchedule plan = PlanRing(RingKind::kAllreduce, 0, 3, {12, 12, 16}, 4, 10);
  for (const RingSegment& s : plan.recvs) {
    CHECK_EQ(s.bytes % 4, 0);
    CHECK(s.bytes <= 8);
  }
}

TEST(RingRunsAcrossHostsFromTheSmallestSizeUnderAuto) {
  auto wins = [](const char* text, int hosts, int ranks, int64_t bytes, int64_t min_bytes) {
    hvdkeras::RingSetting setting = hvdkeras::RingSetting::kOff;
    CHECK(hvdkeras::ParseRingSetting(text, &setting));
    return hvdkeras::RingWins(setting, hosts, ranks, bytes, min_bytes);
  };
  CHECK(wins("auto", 3, 3, 1 << 20, 1 << 20));
  CHECK(!wins("auto", 3, 3, (1 << 20) - 1, 1 << 20));
  CHECK(!wins("auto", 1, 4, 1 << 30, 1 << 20));  // one host: MPI's shared memory
  CHECK(wins("on", 1, 2, 4, 1 << 20));
  CHECK(!wins("on", 1, 1, 1 << 30, 0));  // one rank: nothing to do
  CHECK(!wins("off", 4, 4, 1 << 30, 0));
  hvdkeras::RingSetting untouched = hvdkeras::RingSetting::kOn;
  CHECK(!hvdkeras::ParseRingSetting("sometimes", &untouched));
  CHECK(untouched == hvdkeras::RingSetting::kOn);
}

TEST(SegmentSizeStaysBetween64KiBAnd1MiB) {
  CHECK_EQ(hvdkeras::RingSegmentBytes(1024, 3), int64_t{64} << 10);
  CHECK_EQ(hvdkeras::RingSegmentBytes(int64_t{1} << 32, 3), int64_t{1} << 20);
  CHECK_EQ(hvdkeras::RingSegmentBytes(int64_t{16} << 20, 4), int64_t{1} << 20);
  CHECK_EQ(hvdkeras::RingSegmentBytes(int64_t{4} << 20, 4), int64_t{256} << 10);
}

}  // namespace

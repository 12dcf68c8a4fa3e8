// Unit tests of the fusion planner (core/fusion_planner.cc): batches by key,
// threshold and order, and randomized invariants.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "core/fusion_planner.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::OpType;
using hvdkeras::ReduceOp;
using test_harness::Lcg;
using test_harness::g_current_test;
using hvdkeras::FusionItem;
using hvdkeras::FusionKey;
using Plan = std::vector<std::vector<int>>;

// ==========================================================================
// PlanFusion
// ==========================================================================

FusionItem Item(const FusionKey& key, int64_t bytes) {
  FusionItem item;
  item.key = key;
  item.bytes = bytes;
  return item;
}

FusionKey KeyA() { return FusionKey(); }  // float32 Sum allreduce
FusionKey KeyB() {
  FusionKey k;
  k.dtype = DataType::kFloat16;
  return k;
}

TEST(FusionEmptyInput) {
  CHECK_EQ(hvdkeras::PlanFusion({}, 100), Plan{});
  CHECK_EQ(hvdkeras::PlanFusion({}, 0), Plan{});
}

TEST(FusionOneItem) {
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 10)}, 100), (Plan{{0}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 0)}, 100), (Plan{{0}}));
}

TEST(FusionSameKeyUnderThresholdFusesInOrder) {
  std::vector<FusionItem> items = {Item(KeyA(), 10), Item(KeyA(), 20), Item(KeyA(), 30),
                                   Item(KeyA(), 0)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 1, 2, 3}}));
}

TEST(FusionThresholdExceededSplits) {
  std::vector<FusionItem> items = {Item(KeyA(), 40), Item(KeyA(), 40), Item(KeyA(), 40),
                                   Item(KeyA(), 40), Item(KeyA(), 40)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 1}, {2, 3}, {4}}));
}

TEST(FusionOversizedItemGetsOwnBatch) {
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 500)}, 100), (Plan{{0}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 500), Item(KeyA(), 500)}, 100),
           (Plan{{0}, {1}}));
  // Small items around it still fuse with each other, never with it.
  std::vector<FusionItem> items = {Item(KeyA(), 10), Item(KeyA(), 500), Item(KeyA(), 10),
                                   Item(KeyA(), 1)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 2, 3}, {1}}));
  // Nothing joins an oversized item's batch, not even a zero-byte item.
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 500), Item(KeyA(), 0)}, 100),
           (Plan{{0}, {1}}));
}

TEST(FusionDifferentKeysNeverShareABatch) {
  std::vector<std::pair<const char*, FusionKey>> variants;
  {
    FusionKey k;
    k.dtype = DataType::kFloat64;
    variants.push_back({"dtype", k});
  }
  {
    FusionKey k;
    k.reduce_op = ReduceOp::kAverage;
    variants.push_back({"reduce_op", k});
  }
  {
    FusionKey k;
    k.prescale = 0.5;
    variants.push_back({"prescale", k});
  }
  {
    FusionKey k;
    k.postscale = 0.5;
    variants.push_back({"postscale", k});
  }
  {
    FusionKey k;
    k.op_type = OpType::kBroadcast;
    variants.push_back({"op_type", k});
  }
  {
    FusionKey k;
    k.root_rank = 1;
    variants.push_back({"root_rank", k});
  }
  {
    FusionKey k;
    k.device = hvdkeras::DeviceKind::kGpu;
    variants.push_back({"device", k});
  }
  for (const auto& [what, other] : variants) {
    g_current_test = what;
    CHECK(!(KeyA() == other));
    CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 1), Item(other, 1)}, 1 << 20),
             (Plan{{0}, {1}}));
    CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 1), Item(other, 1), Item(KeyA(), 1),
                                   Item(other, 1)},
                                  1 << 20),
             (Plan{{0, 2}, {1, 3}}));
  }
  g_current_test = "FusionDifferentKeysNeverShareABatch";
  // Broadcasts with different roots, all keys distinct from each other.
  FusionKey b0, b1;
  b0.op_type = b1.op_type = OpType::kBroadcast;
  b0.dtype = b1.dtype = DataType::kUInt8;
  b1.root_rank = 1;
  CHECK_EQ(hvdkeras::PlanFusion({Item(b0, 8), Item(b1, 8), Item(b0, 8), Item(KeyA(), 8)}, 100),
           (Plan{{0, 2}, {1}, {3}}));
}

TEST(FusionInterleavedKeysFuseFirstFit) {
  // A1 B1 A2 B2 -> [A1 A2], [B1 B2], ordered by first item.
  std::vector<FusionItem> items = {Item(KeyA(), 10), Item(KeyB(), 10), Item(KeyA(), 10),
                                   Item(KeyB(), 10)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 2}, {1, 3}}));
  // B first: B's batch comes first.
  items = {Item(KeyB(), 10), Item(KeyA(), 10), Item(KeyB(), 10), Item(KeyA(), 10)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 2}, {1, 3}}));
  // First-fit: a later small item goes back into the earliest batch with room.
  items = {Item(KeyA(), 60), Item(KeyA(), 60), Item(KeyA(), 30), Item(KeyA(), 10),
           Item(KeyA(), 5)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 100), (Plan{{0, 2, 3}, {1, 4}}));
}

TEST(FusionNotFusableItemsStayAlone) {
  FusionItem lone = Item(KeyA(), 8);
  lone.fusable = false;
  // A non-fusable item neither joins an open batch nor lets others join it.
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 8), lone, Item(KeyA(), 8), lone, Item(KeyA(), 8)},
                                1000),
           (Plan{{0, 2, 4}, {1}, {3}}));
  CHECK_EQ(hvdkeras::PlanFusion({lone, Item(KeyA(), 8)}, 1000), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({lone, lone}, 1000), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({lone}, 0), (Plan{{0}}));
}

TEST(FusionNonPositiveThresholdDisablesFusion) {
  std::vector<FusionItem> items = {Item(KeyA(), 1), Item(KeyA(), 1), Item(KeyB(), 0),
                                   Item(KeyA(), 0)};
  CHECK_EQ(hvdkeras::PlanFusion(items, 0), (Plan{{0}, {1}, {2}, {3}}));
  CHECK_EQ(hvdkeras::PlanFusion(items, -1), (Plan{{0}, {1}, {2}, {3}}));
  CHECK_EQ(hvdkeras::PlanFusion(items, std::numeric_limits<int64_t>::min()),
           (Plan{{0}, {1}, {2}, {3}}));
  // Even zero-byte items (0 + 0 <= 0) are not fused when fusion is off.
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 0), Item(KeyA(), 0)}, 0), (Plan{{0}, {1}}));
}

TEST(FusionExactThresholdBoundary) {
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 50), Item(KeyA(), 50)}, 100), (Plan{{0, 1}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 50), Item(KeyA(), 51)}, 100), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 100)}, 100), (Plan{{0}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 100), Item(KeyA(), 1)}, 100), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 101), Item(KeyA(), 0)}, 100), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 1), Item(KeyA(), 1)}, 1), (Plan{{0}, {1}}));
  CHECK_EQ(hvdkeras::PlanFusion({Item(KeyA(), 1), Item(KeyA(), 1)}, 2), (Plan{{0, 1}}));
}

// Random inputs: the plan is deterministic and satisfies the documented
// invariants, and matches a straightforward reference implementation.
TEST(FusionRandomInvariantsAndDeterminism) {
  const FusionKey keys[] = {KeyA(), KeyB(), [] {
                              FusionKey k;
                              k.op_type = OpType::kBroadcast;
                              k.dtype = DataType::kUInt8;
                              return k;
                            }()};
  Lcg rng(12345);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = rng.Below(40);
    const int64_t threshold = rng.Below(5) == 0 ? 0 : 1 + rng.Below(200);
    std::vector<FusionItem> items;
    std::vector<int> key_of;
    for (int i = 0; i < n; ++i) {
      const int k = rng.Below(3);
      key_of.push_back(k);
      items.push_back(Item(keys[k], rng.Below(4) == 0 ? 250 : rng.Below(80)));
      items.back().fusable = rng.Below(8) != 0;
    }
    const Plan plan = hvdkeras::PlanFusion(items, threshold);
    CHECK_EQ(hvdkeras::PlanFusion(items, threshold), plan);  // deterministic

    // Reference: first-fit into the earliest batch of the same key with room.
    Plan expected;
    std::vector<int64_t> used;
    for (int i = 0; i < n; ++i) {
      size_t b = 0;
      if (threshold > 0 && items[i].fusable) {
        for (; b < expected.size(); ++b) {
          if (items[expected[b][0]].fusable && key_of[expected[b][0]] == key_of[i] &&
              used[b] + items[i].bytes <= threshold) {
            break;
          }
        }
      } else {
        b = expected.size();
      }
      if (b == expected.size()) {
        expected.emplace_back();
        used.push_back(0);
      }
      expected[b].push_back(i);
      used[b] += items[i].bytes;
    }
    CHECK_EQ(plan, expected);

    // Invariants stated in fusion_planner.h.
    std::vector<int> seen(n, 0);
    int previous_first = -1;
    for (const auto& batch : plan) {
      CHECK(!batch.empty());
      if (batch.empty()) continue;
      CHECK(batch[0] > previous_first);  // batches ordered by first item
      previous_first = batch[0];
      int64_t sum = 0;
      for (size_t j = 0; j < batch.size(); ++j) {
        ++seen[batch[j]];
        sum += items[batch[j]].bytes;
        CHECK(items[batch[j]].key == items[batch[0]].key);
        if (j) CHECK(batch[j] > batch[j - 1]);  // execution order kept inside a batch
      }
      if (batch.size() > 1) {
        CHECK(threshold > 0);
        CHECK(sum <= threshold);
        for (int i : batch) CHECK(items[i].fusable);
      }
    }
    for (int i = 0; i < n; ++i) CHECK_EQ(seen[i], 1);  // every item exactly once
  }
}

}  // namespace

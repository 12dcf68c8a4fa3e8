// Unit tests of the engine's pure logic: fusion planning, the response cache,
// the coordinator and its validation messages, the wire encoding, scaling and
// the 16-bit float conversions, the output block pool, the reduction
// kernels of the shared-memory allreduce. Built and run without MPI and without
// TensorFlow (tests/test_core_logic.py compiles it together with only
// common.cc, message.cc, coordinator.cc, response_cache.cc, fusion_planner.cc,
// scaling.cc, block_pool.cc and reduce_kernels.cc).
//
// A tiny self-contained harness: CHECK / CHECK_EQ print file:line and the
// failing expression, count failures, and main() returns non-zero if any
// check failed.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/block_pool.h"
#include "core/common.h"
#include "core/coordinator.h"
#include "core/fusion_planner.h"
#include "core/half.h"
#include "core/message.h"
#include "core/reduce_kernels.h"
#include "core/response_cache.h"
#include "core/scaling.h"

namespace {

int g_checks = 0;
int g_failures = 0;
const char* g_current_test = "";

// ---- Printing values for failure messages --------------------------------

template <typename T>
std::string Show(const T& v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

std::string Show(const std::string& s) { return "\"" + s + "\""; }
[[maybe_unused]] std::string Show(const char* s) { return Show(std::string(s)); }
[[maybe_unused]] std::string Show(bool b) { return b ? "true" : "false"; }
// Small integers print as numbers, not characters.
[[maybe_unused]] std::string Show(int8_t v) { return std::to_string(v); }
[[maybe_unused]] std::string Show(uint8_t v) { return std::to_string(v); }
std::string Show(uint16_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%04x", static_cast<unsigned>(v));
  return buf;
}
std::string Show(hvdkeras::Response::Kind k) {
  return k == hvdkeras::Response::Kind::kOk ? "kOk" : "kError";
}

template <typename T>
std::string Show(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += Show(v[i]);
  }
  return s + "]";
}

void Fail(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", file, line, g_current_test,
               what.c_str());
}

#define CHECK(cond)                                 \
  do {                                              \
    ++g_checks;                                     \
    if (!(cond)) Fail(__FILE__, __LINE__, #cond);   \
  } while (0)

#define CHECK_EQ(a, b)                                                               \
  do {                                                                               \
    ++g_checks;                                                                      \
    const auto& check_a_ = (a);                                                      \
    const auto& check_b_ = (b);                                                      \
    if (!(check_a_ == check_b_)) {                                                   \
      Fail(__FILE__, __LINE__,                                                       \
           std::string(#a " == " #b "\n    left:  ") + Show(check_a_) +              \
               "\n    right: " + Show(check_b_));                                    \
    }                                                                                \
  } while (0)

struct TestCase {
  const char* name;
  void (*fn)();
};

std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { Registry().push_back({name, fn}); }
};

#define TEST(name)                                   \
  void name();                                       \
  const Registrar name##_registrar(#name, &name);    \
  void name()

// Deterministic pseudo-random numbers (no <random> distributions, whose
// output differs between standard libraries).
struct Lcg {
  uint64_t state;
  explicit Lcg(uint64_t seed) : state(seed) {}
  uint32_t Next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint32_t>(n)); }
};

using hvdkeras::DataType;
using hvdkeras::FusionItem;
using hvdkeras::FusionKey;
using hvdkeras::OpType;
using hvdkeras::ReduceOp;
using hvdkeras::Request;
using hvdkeras::Response;
using hvdkeras::Shape;
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

// ==========================================================================
// ResponseCache
// ==========================================================================

Request MakeRequest(const std::string& name, Shape shape = {4},
                    DataType dtype = DataType::kFloat32, int32_t rank = 0) {
  Request r;
  r.name = name;
  r.rank = rank;
  r.dtypes = {dtype};
  r.shapes = {std::move(shape)};
  return r;
}

// Puts a request with the Ok response the coordinator would have sent.
void PutReq(hvdkeras::ResponseCache& cache, const Request& request) {
  Response response;
  response.name = request.name;
  response.agreed = request;
  cache.Put(request, response);
}

TEST(CacheLookupAfterPut) {
  hvdkeras::ResponseCache cache(4);
  CHECK_EQ(cache.capacity(), size_t{4});
  CHECK_EQ(cache.num_slots(), size_t{0});
  CHECK_EQ(cache.Lookup("a"), -1);
  PutReq(cache, MakeRequest("a", {2, 3}));
  CHECK_EQ(cache.Lookup("a"), 0);
  CHECK_EQ(cache.Signature(0).name, std::string("a"));
  CHECK(cache.Signature(0).SameSignature(MakeRequest("a", {2, 3})));
  CHECK_EQ(cache.Lookup("b"), -1);
  PutReq(cache, MakeRequest("b"));
  CHECK_EQ(cache.Lookup("b"), 1);
  CHECK_EQ(cache.num_slots(), size_t{2});
}

TEST(CachePutKnownNameRefreshesSignatureAndKeepsSlot) {
  hvdkeras::ResponseCache cache(4);
  PutReq(cache, MakeRequest("a", {2}));
  PutReq(cache, MakeRequest("b", {2}));
  PutReq(cache, MakeRequest("a", {3}, DataType::kFloat64));
  CHECK_EQ(cache.Lookup("a"), 0);
  CHECK_EQ(cache.num_slots(), size_t{2});
  CHECK_EQ(cache.Signature(0).shapes, std::vector<Shape>{Shape{3}});
  CHECK(cache.Signature(0).dtypes == std::vector<DataType>{DataType::kFloat64});
  CHECK(!cache.Signature(0).SameSignature(MakeRequest("a", {2})));
  CHECK_EQ(cache.CachedResponse(0).agreed.shapes, std::vector<Shape>{Shape{3}});

  // The stored response is refreshed along with the signature.
  Request gather = MakeRequest("a", {5});
  gather.op_type = OpType::kAllgather;
  Response response;
  response.name = "a";
  response.agreed = gather;
  response.sizes = {5, 7};
  cache.Put(gather, response);
  CHECK_EQ(cache.Lookup("a"), 0);
  CHECK_EQ(cache.CachedResponse(0).sizes, (std::vector<int64_t>{5, 7}));
  CHECK(cache.CachedResponse(0).agreed.op_type == OpType::kAllgather);
}

TEST(CacheLruEviction) {
  // At capacity the least recently used entry goes; its slot is reused.
  hvdkeras::ResponseCache cache(2);
  PutReq(cache, MakeRequest("a"));
  PutReq(cache, MakeRequest("b"));
  PutReq(cache, MakeRequest("c"));
  CHECK_EQ(cache.Lookup("a"), -1);
  CHECK_EQ(cache.Lookup("b"), 1);
  CHECK_EQ(cache.Lookup("c"), 0);
  CHECK_EQ(cache.num_slots(), size_t{2});

  // Touch protects an entry.
  hvdkeras::ResponseCache touched(2);
  PutReq(touched, MakeRequest("a"));
  PutReq(touched, MakeRequest("b"));
  touched.Touch(touched.Lookup("a"));
  PutReq(touched, MakeRequest("c"));
  CHECK_EQ(touched.Lookup("a"), 0);
  CHECK_EQ(touched.Lookup("b"), -1);
  CHECK_EQ(touched.Lookup("c"), 1);

  // Refreshing a known name with Put also counts as a use.
  hvdkeras::ResponseCache refreshed(2);
  PutReq(refreshed, MakeRequest("a"));
  PutReq(refreshed, MakeRequest("b"));
  PutReq(refreshed, MakeRequest("a", {9}));
  PutReq(refreshed, MakeRequest("c"));
  CHECK_EQ(refreshed.Lookup("a"), 0);
  CHECK_EQ(refreshed.Lookup("b"), -1);
  CHECK_EQ(refreshed.Lookup("c"), 1);

  // A longer chain: eviction order follows recency exactly.
  hvdkeras::ResponseCache chain(3);
  PutReq(chain, MakeRequest("a"));  // 0
  PutReq(chain, MakeRequest("b"));  // 1
  PutReq(chain, MakeRequest("c"));  // 2
  chain.Touch(chain.Lookup("a"));
  chain.Touch(chain.Lookup("b"));
  PutReq(chain, MakeRequest("d"));  // evicts c -> slot 2
  CHECK_EQ(chain.Lookup("c"), -1);
  CHECK_EQ(chain.Lookup("d"), 2);
  PutReq(chain, MakeRequest("e"));  // evicts a -> slot 0
  CHECK_EQ(chain.Lookup("a"), -1);
  CHECK_EQ(chain.Lookup("e"), 0);
  PutReq(chain, MakeRequest("f"));  // evicts b -> slot 1
  CHECK_EQ(chain.Lookup("b"), -1);
  CHECK_EQ(chain.Lookup("f"), 1);
  CHECK_EQ(chain.num_slots(), size_t{3});
}

TEST(CacheEraseFreesSlotSmallestFirst) {
  hvdkeras::ResponseCache cache(8);
  for (const char* n : {"a", "b", "c", "d"}) PutReq(cache, MakeRequest(n));
  cache.Erase(cache.Lookup("c"));  // slot 2
  cache.Erase(cache.Lookup("a"));  // slot 0
  CHECK_EQ(cache.Lookup("a"), -1);
  CHECK_EQ(cache.Lookup("c"), -1);
  CHECK_EQ(cache.Signature(0).name, std::string(""));
  CHECK_EQ(cache.CachedResponse(0).name, std::string(""));
  cache.Erase(0);  // erasing a free slot is a no-op
  PutReq(cache, MakeRequest("e"));
  CHECK_EQ(cache.Lookup("e"), 0);  // smallest free slot first
  PutReq(cache, MakeRequest("f"));
  CHECK_EQ(cache.Lookup("f"), 2);
  PutReq(cache, MakeRequest("g"));
  CHECK_EQ(cache.Lookup("g"), 4);  // no free slot left: a new one
  CHECK_EQ(cache.num_slots(), size_t{5});
  CHECK_EQ(cache.Lookup("b"), 1);
  CHECK_EQ(cache.Lookup("d"), 3);

  // An erased entry no longer counts toward the capacity.
  hvdkeras::ResponseCache small(2);
  PutReq(small, MakeRequest("a"));
  PutReq(small, MakeRequest("b"));
  small.Erase(small.Lookup("a"));
  PutReq(small, MakeRequest("c"));
  CHECK_EQ(small.Lookup("b"), 1);
  CHECK_EQ(small.Lookup("c"), 0);
}

TEST(CacheCapacityZeroCachesNothing) {
  hvdkeras::ResponseCache cache(0);
  PutReq(cache, MakeRequest("a"));
  PutReq(cache, MakeRequest("a"));
  PutReq(cache, MakeRequest("b"));
  CHECK_EQ(cache.Lookup("a"), -1);
  CHECK_EQ(cache.Lookup("b"), -1);
  CHECK_EQ(cache.num_slots(), size_t{0});
}

TEST(CacheCapacityOne) {
  hvdkeras::ResponseCache cache(1);
  PutReq(cache, MakeRequest("a"));
  PutReq(cache, MakeRequest("b"));
  CHECK_EQ(cache.Lookup("a"), -1);
  CHECK_EQ(cache.Lookup("b"), 0);
  CHECK_EQ(cache.num_slots(), size_t{1});
}

// A reference model of the documented behaviour, for the randomized test.
struct ModelCache {
  size_t capacity;
  std::vector<std::string> slot_name;  // "" = free
  std::vector<std::string> recency;    // front = most recent
  explicit ModelCache(size_t c) : capacity(c) {}
  int Lookup(const std::string& n) const {
    for (size_t i = 0; i < slot_name.size(); ++i) {
      if (slot_name[i] == n) return static_cast<int>(i);
    }
    return -1;
  }
  void Use(const std::string& n) {
    for (size_t i = 0; i < recency.size(); ++i) {
      if (recency[i] == n) {
        recency.erase(recency.begin() + i);
        break;
      }
    }
    recency.insert(recency.begin(), n);
  }
  void Put(const std::string& n) {
    if (capacity == 0) return;
    if (Lookup(n) >= 0) {
      Use(n);
      return;
    }
    if (recency.size() >= capacity) Erase(Lookup(recency.back()));
    int slot = -1;
    for (size_t i = 0; i < slot_name.size(); ++i) {
      if (slot_name[i].empty()) {
        slot = static_cast<int>(i);
        break;
      }
    }
    if (slot < 0) {
      slot_name.emplace_back();
      slot = static_cast<int>(slot_name.size()) - 1;
    }
    slot_name[slot] = n;
    Use(n);
  }
  void Erase(int slot) {
    if (slot_name[slot].empty()) return;
    for (size_t i = 0; i < recency.size(); ++i) {
      if (recency[i] == slot_name[slot]) {
        recency.erase(recency.begin() + i);
        break;
      }
    }
    slot_name[slot].clear();
  }
};

// Two caches fed the same Put/Touch/Erase sequence end identical slot for
// slot (what keeps every rank's cache in step), and both match the model.
// The caches get requests differing only in the sending rank, as on two
// ranks of a job.
TEST(CacheIdenticalUnderSameSequence) {
  for (size_t capacity : {size_t{1}, size_t{3}, size_t{8}, size_t{64}}) {
    hvdkeras::ResponseCache one(capacity), two(capacity);
    ModelCache model(capacity);
    Lcg rng(777 + capacity);
    for (int step = 0; step < 3000; ++step) {
      const std::string name = "t" + std::to_string(rng.Below(12));
      const int what = rng.Below(10);
      if (what < 6) {
        const Shape shape = {1 + rng.Below(3)};
        PutReq(one, MakeRequest(name, shape, DataType::kFloat32, 0));
        PutReq(two, MakeRequest(name, shape, DataType::kFloat32, 1));
        model.Put(name);
      } else if (what < 8) {
        const int slot = one.Lookup(name);
        CHECK_EQ(two.Lookup(name), slot);
        if (slot >= 0) {
          one.Touch(slot);
          two.Touch(slot);
          model.Use(name);
        }
      } else {
        const int slot = one.Lookup(name);
        if (slot >= 0) {
          one.Erase(slot);
          two.Erase(slot);
          model.Erase(slot);
        }
      }
      CHECK_EQ(one.num_slots(), two.num_slots());
      CHECK_EQ(one.num_slots(), model.slot_name.size());
      for (int i = 0; i < 12; ++i) {
        const std::string n = "t" + std::to_string(i);
        CHECK_EQ(one.Lookup(n), two.Lookup(n));
        CHECK_EQ(one.Lookup(n), model.Lookup(n));
      }
      for (size_t s = 0; s < one.num_slots(); ++s) {
        CHECK_EQ(one.Signature(static_cast<int>(s)).name, two.Signature(static_cast<int>(s)).name);
        CHECK(one.Signature(static_cast<int>(s)).SameSignature(two.Signature(static_cast<int>(s))));
        CHECK_EQ(one.CachedResponse(static_cast<int>(s)).name,
                 two.CachedResponse(static_cast<int>(s)).name);
      }
      if (g_failures > 20) return;  // do not flood the output
    }
  }
}

// ==========================================================================
// Coordinator and ValidateRequests
// ==========================================================================

using hvdkeras::SteadyClock;
using std::chrono::milliseconds;
using std::chrono::seconds;

Request Allreduce(const std::string& name, int rank, Shape shape = {2, 3},
                  DataType dtype = DataType::kFloat32) {
  return MakeRequest(name, std::move(shape), dtype, rank);
}

Request Broadcast(const std::string& name, int rank, int root) {
  Request r = MakeRequest(name, {5}, DataType::kInt32, rank);
  r.op_type = OpType::kBroadcast;
  r.root_rank = root;
  return r;
}

Request OfType(OpType op, const std::string& name, int rank, Shape shape = {4, 3}) {
  Request r = MakeRequest(name, std::move(shape), DataType::kFloat32, rank);
  r.op_type = op;
  return r;
}

Request Alltoall(const std::string& name, int rank, int64_t rows, std::vector<int64_t> splits) {
  Request r = OfType(OpType::kAlltoall, name, rank, {rows, 2});
  r.splits = std::move(splits);
  return r;
}

Request Join(int rank) {
  Request r;
  r.name = "join";
  r.rank = rank;
  r.op_type = OpType::kJoin;
  return r;
}

std::vector<std::string> Names(const std::vector<Response>& responses) {
  std::vector<std::string> names;
  for (const Response& r : responses) names.push_back(r.name);
  return names;
}

// ValidateRequests over the given requests; no rank has joined unless said.
std::string Validate(const std::vector<Request>& submitted, int world_size,
                     std::vector<bool> joined = {}) {
  if (joined.empty()) joined.assign(world_size, false);
  return hvdkeras::ValidateRequests(submitted, world_size, joined);
}

const SteadyClock::time_point kT0 = SteadyClock::time_point(seconds(1000));

TEST(CoordinatorReadyOnlyWhenAllRanksSent) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK(c.TakeReady().empty());
  CHECK(!c.has_ready());
  CHECK_EQ(c.pending_count(), size_t{1});
  c.Add(Allreduce("x", 1), kT0);  // a repeat from the same rank does not count twice
  CHECK(c.TakeReady().empty());
  c.Add(Allreduce("x", 2), kT0);
  CHECK(c.has_ready());
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].name, std::string("x"));
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].error, std::string(""));
    CHECK(ready[0].agreed.SameSignature(Allreduce("x", 0)));
  }
  CHECK_EQ(c.pending_count(), size_t{0});
  CHECK(c.TakeReady().empty());  // taken once

  // The name can be used again afterwards.
  c.Add(Allreduce("x", 2), kT0);
  CHECK(c.TakeReady().empty());
  CHECK_EQ(c.pending_count(), size_t{1});

  // A world of one: ready at once.
  hvdkeras::Coordinator solo(1);
  solo.Add(Allreduce("y", 0), kT0);
  CHECK_EQ(Names(solo.TakeReady()), std::vector<std::string>{"y"});
}

TEST(CoordinatorReadyOrderIsCompletionOrder) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("y", 0), kT0);
  c.Add(Allreduce("z", 0), kT0);
  c.Add(Allreduce("z", 1), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK_EQ(c.pending_count(), size_t{1});
  c.Add(Allreduce("y", 1), kT0);
  CHECK_EQ(Names(c.TakeReady()), (std::vector<std::string>{"z", "x", "y"}));

  // Names that become ready in separate calls come out separately.
  c.Add(Allreduce("b", 1), kT0);
  c.Add(Allreduce("a", 1), kT0);
  c.Add(Allreduce("a", 0), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"a"});
  c.Add(Allreduce("b", 0), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"b"});
}

TEST(CoordinatorMismatchGivesErrorResponse) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0, {2, 3}), kT0);
  c.Add(Allreduce("x", 1, {3, 3}), kT0);
  c.Add(Allreduce("ok", 1), kT0);
  c.Add(Allreduce("ok", 0), kT0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), (std::vector<std::string>{"x", "ok"}));
  if (ready.size() == 2) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error,
             std::string("Mismatched shapes for allreduce of tensor 'x' across ranks: [2, 3] "
                         "from rank 0; [3, 3] from rank 1. Every rank must submit the same "
                         "shapes under one name."));
    CHECK_EQ(ready[1].kind, Response::Kind::kOk);
  }
  CHECK_EQ(c.pending_count(), size_t{0});
}

TEST(CoordinatorJoinedRanksCountAsReady) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK(!c.any_joined());
  c.Add(Join(2), kT0);  // x only waited for rank 2
  CHECK(c.any_joined());
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"x"});
  if (ready.size() == 1) CHECK_EQ(ready[0].kind, Response::Kind::kOk);

  c.Add(Allreduce("y", 0), kT0);
  CHECK(c.TakeReady().empty());  // rank 1 has neither sent y nor joined
  c.Add(Allreduce("y", 1), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"y"});

  // The join completes once every rank has joined, naming the last one.
  c.Add(Join(0), kT0);
  CHECK(c.TakeReady().empty());
  c.Add(Join(1), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"join"});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].last_joined_rank, 1);
  }
  CHECK(!c.any_joined());
  CHECK_EQ(c.pending_count(), size_t{0});

  // Afterwards every rank counts again.
  c.Add(Allreduce("z", 0), kT0);
  c.Add(Allreduce("z", 1), kT0);
  CHECK(c.TakeReady().empty());
  c.Add(Allreduce("z", 2), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"z"});
}

TEST(CoordinatorJoinPromotesWaitingNamesInArrivalOrder) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("b", 0), kT0);
  c.Add(Allreduce("a", 0), kT0);
  c.Add(Allreduce("c", 0), kT0);
  c.Add(Join(1), kT0);
  // Promoted in the order the names were first seen, not by name.
  CHECK_EQ(Names(c.TakeReady()), (std::vector<std::string>{"b", "a", "c"}));
  // A broadcast whose root has joined fails on the ranks that submitted it.
  c.Add(Broadcast("bc", 0, 1), kT0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"bc"});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error, std::string("Cannot run broadcast of tensor 'bc': its root rank 1 "
                                         "has already called join()."));
  }
  c.Add(Broadcast("bc0", 0, 0), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"bc0"});
  if (ready.size() == 1) CHECK_EQ(ready[0].kind, Response::Kind::kOk);
  c.Add(Join(0), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"join"});
  if (ready.size() == 1) CHECK_EQ(ready[0].last_joined_rank, 0);
}

TEST(CoordinatorAllgatherAndAlltoallSizes) {
  hvdkeras::Coordinator c(3);
  const int64_t first_dims[3][2] = {{2, 3}, {5, 3}, {1, 0}};
  for (int r = 0; r < 3; ++r) {
    Request g = OfType(OpType::kAllgather, "g", r);
    g.dtypes = {DataType::kFloat32, DataType::kInt32};
    g.shapes = {{first_dims[r][0], 4}, {first_dims[r][1]}};
    c.Add(g, kT0);
  }
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{2, 5, 1, 3, 3, 0}));  // tensor-major
  }

  c.Add(Alltoall("a", 0, 3, {1, 2, 0}), kT0);
  c.Add(Alltoall("a", 1, 5, {0, 5, 0}), kT0);
  c.Add(Alltoall("a", 2, 1, {1, 0, 0}), kT0);
  ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{1, 2, 0, 0, 5, 0, 1, 0, 0}));
  }

  // A joined rank contributes zero rows.
  c.Add(Join(1), kT0);
  c.Add(OfType(OpType::kAllgather, "h", 0, {2, 4}), kT0);
  c.Add(OfType(OpType::kAllgather, "h", 2, {6, 4}), kT0);
  ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{2, 0, 6}));
}

TEST(CoordinatorStalls) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 2), kT0 + seconds(1));
  CHECK(c.FindStalls(kT0 + seconds(5), 10.0).empty());
  std::vector<hvdkeras::Stall> stalls = c.FindStalls(kT0 + seconds(11), 10.0);
  CHECK_EQ(stalls.size(), size_t{1});
  if (stalls.size() == 1) {
    CHECK_EQ(stalls[0].name, std::string("x"));
    CHECK_EQ(stalls[0].seconds, 11.0);  // measured from the first submission
    CHECK_EQ(stalls[0].submitted, (std::vector<int>{0, 2}));
    CHECK_EQ(stalls[0].missing, std::vector<int>{1});
  }
  CHECK(c.FindStalls(kT0 + seconds(12), 10.0).empty());  // reported once...
  CHECK_EQ(c.FindStalls(kT0 + seconds(12), 10.0, /*only_new=*/false).size(), size_t{1});

  // A request's age moves its start back: y was sent at 11 s after waiting
  // 20 s on its rank.
  Request y = Allreduce("y", 0);
  y.age_seconds = 20.0;
  c.Add(y, kT0 + seconds(11));
  stalls = c.FindStalls(kT0 + seconds(12), 20.0);
  CHECK_EQ(stalls.size(), size_t{1});
  if (stalls.size() == 1) {
    CHECK_EQ(stalls[0].name, std::string("y"));
    CHECK_EQ(stalls[0].seconds, 21.0);
  }

  // Failing stalled names turns them into error responses, in name order.
  c.FailStalled(kT0 + seconds(30), 10.0);
  CHECK_EQ(c.pending_count(), size_t{0});
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), (std::vector<std::string>{"x", "y"}));
  if (ready.size() == 2) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error,
             std::string("Collective 'x' stalled for 30 s: rank(s) 1 never submitted it (rank(s) "
                         "0, 2 did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS. Check "
                         "that every rank runs the same collectives (e.g. the same number of "
                         "steps)."));
    CHECK_EQ(ready[1].kind, Response::Kind::kError);
    CHECK_EQ(ready[1].error,
             std::string("Collective 'y' stalled for 39 s: rank(s) 1, 2 never submitted it "
                         "(rank(s) 0 did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS. "
                         "Check that every rank runs the same collectives (e.g. the same number "
                         "of steps)."));
  }
  // Names under the limit are left alone.
  c.Add(Allreduce("z", 0), kT0 + seconds(30));
  c.FailStalled(kT0 + seconds(31), 10.0);
  CHECK(c.TakeReady().empty());
  CHECK_EQ(c.pending_count(), size_t{1});

  // Joined ranks are not listed as missing.
  hvdkeras::Coordinator j(3);
  j.Add(Join(1), kT0);
  j.Add(Allreduce("w", 0), kT0);
  bool found = false;
  for (const hvdkeras::Stall& stall : j.FindStalls(kT0 + seconds(60), 10.0)) {
    CHECK(stall.name != "hvdkeras.join");  // waiting in join() is not a stall
    if (stall.name != "w") continue;
    found = true;
    CHECK_EQ(stall.submitted, std::vector<int>{0});
    CHECK_EQ(stall.missing, std::vector<int>{2});
  }
  CHECK(found);
  // ... and is never ended by the stall shutdown either.
  j.FailStalled(kT0 + seconds(120), 10.0);
  for (const Response& r : j.TakeReady()) CHECK(r.name != "hvdkeras.join");
  CHECK(j.any_joined());
}

TEST(CoordinatorIgnoresRanksOutsideTheWorld) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 5), kT0);
  c.Add(Allreduce("x", -1), kT0);
  CHECK_EQ(c.pending_count(), size_t{0});
}

TEST(CoordinatorReadyTimes) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0), kT0);
  Request late = Allreduce("x", 1);
  late.age_seconds = 0.5;
  c.Add(late, kT0 + seconds(2));
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"x"});
  const auto& times = c.ready_times();
  CHECK_EQ(times.count("x"), size_t{1});
  if (times.count("x") == 1 && times.at("x").size() == 2) {
    CHECK(times.at("x")[0] == kT0);
    CHECK(times.at("x")[1] == kT0 + milliseconds(1500));
  }
  CHECK(c.TakeReady().empty());
  CHECK(c.ready_times().empty());
}

TEST(ValidateMatchingRequests) {
  CHECK_EQ(Validate({Allreduce("x", 0)}, 1), std::string(""));
  CHECK_EQ(Validate({Allreduce("x", 0), Allreduce("x", 1), Allreduce("x", 2)}, 3),
           std::string(""));
  // Multi-tensor requests that agree.
  Request g0 = Allreduce("g", 0), g1 = Allreduce("g", 1);
  for (Request* g : {&g0, &g1}) {
    g->dtypes = {DataType::kFloat32, DataType::kFloat32};
    g->shapes = {{2}, {}};
    g->reduce_op = ReduceOp::kAverage;
    g->prescale = 0.5;
    g->postscale = 3.0;
  }
  CHECK_EQ(Validate({g0, g1}, 2), std::string(""));
  // Broadcasts ignore the reduction fields.
  Request b0 = Broadcast("b", 0, 1), b1 = Broadcast("b", 1, 1);
  b1.reduce_op = ReduceOp::kMax;
  b1.prescale = 7.0;
  CHECK_EQ(Validate({b0, b1}, 2), std::string(""));
  // Allgather and alltoall: first dimensions may differ.
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1, 3}),
                     OfType(OpType::kAllgather, "g", 1, {7, 3})},
                    2),
           std::string(""));
  CHECK_EQ(Validate({Alltoall("a", 0, 3, {1, 2}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string(""));
  // Only the submitting ranks are compared (rank 1 has joined).
  CHECK_EQ(Validate({Allreduce("x", 0), Allreduce("x", 2)}, 3, {false, true, false}),
           std::string(""));
}

TEST(ValidateMismatchMessages) {
  const std::string tail = ". Every rank must submit the same ";

  // Shapes, grouping ranks that agree (the example from coordinator.cc).
  CHECK_EQ(Validate({Allreduce("x", 0, {2, 3}), Allreduce("x", 1, {3, 3}),
                     Allreduce("x", 2, {2, 3})},
                    3),
           "Mismatched shapes for allreduce of tensor 'x' across ranks: [2, 3] from ranks 0, 2; "
           "[3, 3] from rank 1" + tail + "shapes under one name.");
  // Scalars print as [].
  CHECK_EQ(Validate({Allreduce("s", 0, {}), Allreduce("s", 1, {1})}, 2),
           "Mismatched shapes for allreduce of tensor 's' across ranks: [] from rank 0; [1] "
           "from rank 1" + tail + "shapes under one name.");
  // Ranks are named by the requests' own rank fields (here rank 1 joined).
  CHECK_EQ(Validate({Allreduce("x", 0, {1}), Allreduce("x", 2, {2})}, 3, {false, true, false}),
           "Mismatched shapes for allreduce of tensor 'x' across ranks: [1] from rank 0; [2] "
           "from rank 2" + tail + "shapes under one name.");

  // Data types.
  CHECK_EQ(Validate({Allreduce("x", 0, {2}, DataType::kFloat32),
                     Allreduce("x", 1, {2}, DataType::kFloat16),
                     Allreduce("x", 2, {2}, DataType::kBFloat16),
                     Allreduce("x", 3, {2}, DataType::kFloat16)},
                    4),
           "Mismatched data types for allreduce of tensor 'x' across ranks: float32 from rank "
           "0; float16 from ranks 1, 3; bfloat16 from rank 2" + tail +
               "data types under one name.");

  // Reduce ops.
  {
    Request a = Allreduce("x", 0), b = Allreduce("x", 1);
    a.reduce_op = ReduceOp::kSum;
    b.reduce_op = ReduceOp::kAverage;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched reduction ops for allreduce of tensor 'x' across ranks: Sum from rank "
             "0; Average from rank 1" + tail + "reduction ops under one name.");
  }

  // Scale factors (pre and post).
  {
    Request a = Allreduce("x", 0), b = Allreduce("x", 1);
    b.postscale = 0.25;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched scale factors for allreduce of tensor 'x' across ranks: prescale 1 / "
             "postscale 1 from rank 0; prescale 1 / postscale 0.25 from rank 1" + tail +
                 "scale factors under one name.");
    b.postscale = 1.0;
    b.prescale = 0.5;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched scale factors for allreduce of tensor 'x' across ranks: prescale 1 / "
             "postscale 1 from rank 0; prescale 0.5 / postscale 1 from rank 1" + tail +
                 "scale factors under one name.");
  }

  // Broadcast roots.
  CHECK_EQ(Validate({Broadcast("b", 0, 0), Broadcast("b", 1, 1)}, 2),
           "Mismatched root ranks for broadcast of tensor 'b' across ranks: root 0 from rank 0; "
           "root 1 from rank 1" + tail + "root ranks under one name.");

  // Op types (checked first, even when other fields differ too).
  {
    Request a = Allreduce("x", 0, {5}, DataType::kInt32);
    Request b = Broadcast("x", 1, 0);
    b.shapes = {{7}};
    const std::string expected =
        "Mismatched operations for tensor 'x' across ranks: allreduce from rank 0; broadcast "
        "from rank 1. Every rank must run the same collective under one name.";
    CHECK_EQ(Validate({a, b}, 2), expected);
    CHECK_EQ(Validate({b, a}, 2),
             std::string("Mismatched operations for tensor 'x' across ranks: broadcast from "
                         "rank 1; allreduce from rank 0. Every rank must run the same "
                         "collective under one name."));
  }

  // Tensor counts in a group (checked before dtypes and shapes).
  {
    Request a = Allreduce("g", 0), b = Allreduce("g", 1, {7}, DataType::kInt8);
    a.dtypes = {DataType::kFloat32, DataType::kFloat32};
    a.shapes = {{2}, {3}};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched tensor counts for allreduce of tensor 'g' across ranks: 2 tensor(s) "
             "from rank 0; 1 tensor(s) from rank 1" + tail + "tensor counts under one name.");
  }

  // Multi-tensor shapes and dtypes print as tuples.
  {
    Request a = Allreduce("g", 0), b = Allreduce("g", 1);
    a.dtypes = b.dtypes = {DataType::kFloat32, DataType::kFloat32};
    a.shapes = {{2}, {3}};
    b.shapes = {{2}, {4, 1}};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched shapes for allreduce of tensor 'g' across ranks: ([2], [3]) from rank "
             "0; ([2], [4, 1]) from rank 1" + tail + "shapes under one name.");
    b.shapes = a.shapes;
    b.dtypes = {DataType::kFloat32, DataType::kInt64};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched data types for allreduce of tensor 'g' across ranks: (float32, float32) "
             "from rank 0; (float32, int64) from rank 1" + tail + "data types under one name.");
  }

  // Dtype is checked before shape.
  CHECK_EQ(Validate({Allreduce("x", 0, {1}, DataType::kInt32),
                     Allreduce("x", 1, {2}, DataType::kInt64)},
                    2),
           "Mismatched data types for allreduce of tensor 'x' across ranks: int32 from rank 0; "
           "int64 from rank 1" + tail + "data types under one name.");

  // Allgather: all dimensions but the first must match; no scalars.
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1, 3}),
                     OfType(OpType::kAllgather, "g", 1, {1, 4})},
                    2),
           "Mismatched shapes (all dimensions but the first must match) for allgather of tensor "
           "'g' across ranks: [*, 3] from rank 0; [*, 4] from rank 1" + tail +
               "shapes (all dimensions but the first must match) under one name.");
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1}),
                     OfType(OpType::kAllgather, "g", 1, {})},
                    2),
           std::string("Cannot run allgather of tensor 'g': rank 1 sent a scalar, but allgather "
                       "needs at least one dimension."));
  // Reducescatter: no scalars.
  CHECK_EQ(Validate({OfType(OpType::kReducescatter, "r", 0, {}),
                     OfType(OpType::kReducescatter, "r", 1, {})},
                    2),
           std::string("Cannot run reducescatter of tensor 'r': rank 0 sent a scalar, but "
                       "reducescatter splits the first dimension."));
}

TEST(ValidateAlltoallSplits) {
  CHECK_EQ(Validate({Alltoall("a", 0, 3, {1, 2}), Alltoall("a", 1, 3, {3})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 1 gave 1 split(s), but "
                       "the world has 2 rank(s); give one row count per rank."));
  CHECK_EQ(Validate({Alltoall("a", 0, 1, {2, -1}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 0 gave a negative row "
                       "count -1."));
  CHECK_EQ(Validate({Alltoall("a", 0, 4, {1, 2}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 0's splits add up to 3 "
                       "rows, but its tensor has 4 rows."));
}

TEST(ValidateInvalidBroadcastRoot) {
  CHECK_EQ(Validate({Broadcast("b", 0, 2), Broadcast("b", 1, 2)}, 2),
           std::string("Invalid root rank 2 for broadcast of tensor 'b': the world has 2 "
                       "rank(s), so the root must be in 0..1."));
  CHECK_EQ(Validate({Broadcast("b", 0, -1)}, 1),
           std::string("Invalid root rank -1 for broadcast of tensor 'b': the world has 1 "
                       "rank(s), so the root must be in 0..0."));
  CHECK_EQ(Validate({Broadcast("b", 0, 1), Broadcast("b", 1, 1)}, 2), std::string(""));
  CHECK_EQ(Validate({Broadcast("b", 0, 1)}, 2, {false, true}),
           std::string("Cannot run broadcast of tensor 'b': its root rank 1 has already called "
                       "join()."));
}

// ==========================================================================
// Request / response encoding
// ==========================================================================

bool SameRequest(const Request& a, const Request& b) {
  return a.SameSignature(b) && a.rank == b.rank && a.splits == b.splits &&
         a.age_seconds == b.age_seconds;
}

TEST(RequestSameSignature) {
  Request a = MakeRequest("x", {2, 3}), b = MakeRequest("x", {2, 3}, DataType::kFloat32, 5);
  b.age_seconds = 9.0;
  CHECK(a.SameSignature(b));  // rank and age are not part of the signature
  std::vector<std::function<void(Request*)>> changes = {
      [](Request* r) { r->name = "y"; },
      [](Request* r) { r->op_type = OpType::kBroadcast; },
      [](Request* r) { r->reduce_op = ReduceOp::kMax; },
      [](Request* r) { r->prescale = 2.0; },
      [](Request* r) { r->postscale = 2.0; },
      [](Request* r) { r->root_rank = 1; },
      [](Request* r) { r->dtypes = {DataType::kFloat64}; },
      [](Request* r) { r->shapes = {{3, 2}}; },
      [](Request* r) { r->splits = {1, 1}; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    Request c = a;
    changes[i](&c);
    if (c.SameSignature(a) || a.SameSignature(c)) {
      Fail(__FILE__, __LINE__, "change #" + std::to_string(i) + " not seen by SameSignature");
    }
    ++g_checks;
  }
}

TEST(RequestEncodeDecodeRoundTrip) {
  std::vector<Request> requests;
  requests.push_back(Allreduce("plain", 3, {2, 3}));
  {
    Request g = Allreduce("group/with.dots-and_underscores", 1);
    g.op_type = OpType::kAllreduce;
    g.reduce_op = ReduceOp::kProduct;
    g.prescale = 0.1;
    g.postscale = -1.0 / 3.0;
    g.dtypes = {DataType::kFloat16, DataType::kFloat16, DataType::kFloat16};
    g.shapes = {{}, {0}, {1, 2, 3, 4, 5, 6, 7, int64_t{1} << 40}};
    requests.push_back(g);
  }
  {
    Request b = Broadcast(std::string("bin\0ary", 7), 0, 5);
    b.dtypes = {DataType::kBool, DataType::kUInt64};
    b.shapes = {{3}, {1}};
    requests.push_back(b);
  }
  {
    Request empty;  // no tensors at all, empty name
    empty.rank = 7;
    empty.op_type = OpType::kJoin;
    requests.push_back(empty);
  }
  {
    Request a = MakeRequest("a2a", {6, 2}, DataType::kInt64, 2);
    a.op_type = OpType::kAlltoall;
    a.splits = {1, 0, 5, -3};
    a.age_seconds = 12.625;
    requests.push_back(a);
  }
  const std::string bytes = hvdkeras::EncodeRequests(requests);
  std::vector<Request> decoded;
  CHECK(hvdkeras::DecodeRequests(bytes.data(), bytes.size(), &decoded));
  CHECK_EQ(decoded.size(), requests.size());
  for (size_t i = 0; i < decoded.size() && i < requests.size(); ++i) {
    CHECK(SameRequest(decoded[i], requests[i]));
    CHECK_EQ(decoded[i].name, requests[i].name);
  }
  if (decoded.size() > 1) CHECK_EQ(decoded[1].postscale, -1.0 / 3.0);  // bit-exact double

  // Empty list.
  const std::string none = hvdkeras::EncodeRequests({});
  decoded.clear();
  CHECK(hvdkeras::DecodeRequests(none.data(), none.size(), &decoded));
  CHECK(decoded.empty());

  // Every truncation fails, and so do trailing bytes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<Request> partial;
    if (hvdkeras::DecodeRequests(bytes.data(), n, &partial)) {
      Fail(__FILE__, __LINE__, "DecodeRequests accepted a truncation to " + std::to_string(n) +
                                   " of " + std::to_string(bytes.size()) + " bytes");
    }
  }
  const std::string longer = bytes + "x";
  decoded.clear();
  CHECK(!hvdkeras::DecodeRequests(longer.data(), longer.size(), &decoded));
  CHECK(!hvdkeras::DecodeRequests(nullptr, 0, &decoded));

  // A corrupt length field that promises more items than bytes remain is
  // rejected before anything is allocated for it.
  Request one = Allreduce("len", 0, {2});
  std::string corrupt = hvdkeras::EncodeRequests({one});
  // Layout: count(4) name_len(4) "len"(3) rank(4) op(4) reduce(4) pre(8)
  // post(8) root(4) ntensors(4) dtype(4) ndims(4) ...
  const size_t ndims_offset = 4 + 4 + 3 + 4 + 4 + 4 + 8 + 8 + 4 + 4 + 4;
  const uint32_t huge = 0xffffffffu;
  std::memcpy(&corrupt[ndims_offset], &huge, sizeof(huge));
  decoded.clear();
  CHECK(!hvdkeras::DecodeRequests(corrupt.data(), corrupt.size(), &decoded));
}

TEST(ResponseEncodeDecodeRoundTrip) {
  std::vector<Response> responses(4);
  responses[0].name = "ok";
  responses[0].agreed = MakeRequest("ok", {3, 1}, DataType::kBFloat16, 2);
  responses[0].agreed.op_type = OpType::kAllgather;
  responses[0].sizes = {3, 0, 7};
  responses[1].name = "bad";
  responses[1].kind = Response::Kind::kError;
  responses[1].error =
      "Mismatched shapes for allreduce of tensor 'bad' across ranks: [1] from rank 0; [2] from "
      "rank 1. Every rank must submit the same op with the same shapes under one name.";
  responses[2].name = std::string(300, 'n');
  responses[2].kind = Response::Kind::kError;
  responses[2].error = std::string("with\0nul", 8);
  responses[3].name = "join";
  responses[3].agreed.op_type = OpType::kJoin;
  responses[3].last_joined_rank = 3;
  const std::string bytes = hvdkeras::EncodeResponses(responses);
  std::vector<Response> decoded;
  CHECK(hvdkeras::DecodeResponses(bytes.data(), bytes.size(), &decoded));
  CHECK_EQ(decoded.size(), responses.size());
  for (size_t i = 0; i < decoded.size() && i < responses.size(); ++i) {
    CHECK_EQ(decoded[i].kind, responses[i].kind);
    CHECK_EQ(decoded[i].name, responses[i].name);
    CHECK_EQ(decoded[i].error, responses[i].error);
    CHECK(SameRequest(decoded[i].agreed, responses[i].agreed));
    CHECK_EQ(decoded[i].sizes, responses[i].sizes);
    CHECK_EQ(decoded[i].last_joined_rank, responses[i].last_joined_rank);
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<Response> partial;
    if (hvdkeras::DecodeResponses(bytes.data(), n, &partial)) {
      Fail(__FILE__, __LINE__, "DecodeResponses accepted a truncation to " + std::to_string(n) +
                                   " of " + std::to_string(bytes.size()) + " bytes");
    }
  }
  const std::string longer = bytes + "x";
  decoded.clear();
  CHECK(!hvdkeras::DecodeResponses(longer.data(), longer.size(), &decoded));
  const std::string none = hvdkeras::EncodeResponses({});
  decoded.clear();
  CHECK(hvdkeras::DecodeResponses(none.data(), none.size(), &decoded));
  CHECK(decoded.empty());
}

TEST(RequestTotalBytes) {
  Request r = Allreduce("x", 0, {2, 3}, DataType::kFloat64);
  CHECK_EQ(r.TotalBytes(), int64_t{48});
  r.dtypes = {DataType::kFloat16, DataType::kInt64, DataType::kUInt8};
  r.shapes = {{5}, {}, {0, 9}};
  CHECK_EQ(r.TotalBytes(), int64_t{10 + 8 + 0});
}

// ==========================================================================
// float16 / bfloat16 conversions
// ==========================================================================

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t BitsOf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

bool IsHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool IsBFloatNan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Correctly rounded (to nearest, ties to even) value of |f| in a binary
// format with `mantissa_bits` stored mantissa bits and smallest normal
// exponent `min_exp`, computed in double (exact for float inputs).
double ReferenceRound(float f, int mantissa_bits, int min_exp) {
  const double a = std::fabs(static_cast<double>(f));
  if (a == 0) return 0;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exponent = e - 1;
  if (exponent < min_exp) exponent = min_exp;  // subnormal range: fixed ulp
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  const double q = a / ulp;  // exact: a power-of-two scaling
  double n = std::floor(q);
  const double r = q - n;
  if (r > 0.5 || (r == 0.5 && std::fmod(n, 2.0) == 1.0)) n += 1;
  return n * ulp;
}

void CheckHalfAgainstReference(float f) {
  const uint16_t h = hvdkeras::FloatToHalf(f);
  if (std::isnan(f)) {
    if (!IsHalfNan(h)) Fail(__FILE__, __LINE__, "FloatToHalf(nan) is not a NaN: " + Show(h));
    return;
  }
  double expected = ReferenceRound(f, 10, -14);
  if (expected >= 65536.0) expected = std::numeric_limits<double>::infinity();
  const double got = std::fabs(static_cast<double>(hvdkeras::HalfToFloat(h)));
  const bool sign_ok = ((h & 0x8000u) != 0) == std::signbit(f);
  if (got != expected || !sign_ok) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "FloatToHalf(%.9g [0x%08x]) = 0x%04x (%.9g), expected magnitude %.9g", f,
                  BitsOf(f), h, hvdkeras::HalfToFloat(h), expected);
    Fail(__FILE__, __LINE__, buf);
  }
}

void CheckBFloatAgainstReference(float f) {
  const uint16_t b = hvdkeras::FloatToBFloat16(f);
  if (std::isnan(f)) {
    if (!IsBFloatNan(b)) Fail(__FILE__, __LINE__, "FloatToBFloat16(nan) is not a NaN: " + Show(b));
    return;
  }
  double expected = ReferenceRound(f, 7, -126);
  if (expected >= std::ldexp(1.0, 128)) expected = std::numeric_limits<double>::infinity();
  const double got = std::fabs(static_cast<double>(hvdkeras::BFloat16ToFloat(b)));
  const bool sign_ok = ((b & 0x8000u) != 0) == std::signbit(f);
  if (got != expected || !sign_ok) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "FloatToBFloat16(%.9g [0x%08x]) = 0x%04x (%.9g), expected magnitude %.9g", f,
                  BitsOf(f), b, hvdkeras::BFloat16ToFloat(b), expected);
    Fail(__FILE__, __LINE__, buf);
  }
}

TEST(HalfKnownValues) {
  using hvdkeras::FloatToHalf;
  using hvdkeras::HalfToFloat;
  CHECK_EQ(HalfToFloat(0x0000), 0.0f);
  CHECK(std::signbit(HalfToFloat(0x8000)));
  CHECK_EQ(HalfToFloat(0x3c00), 1.0f);
  CHECK_EQ(HalfToFloat(0xc000), -2.0f);
  CHECK_EQ(HalfToFloat(0x3555), 0.333251953125f);
  CHECK_EQ(HalfToFloat(0x7bff), 65504.0f);                    // largest finite
  CHECK_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));       // smallest normal
  CHECK_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));       // smallest subnormal
  CHECK_EQ(HalfToFloat(0x03ff), 1023 * std::ldexp(1.0f, -24));  // largest subnormal
  CHECK_EQ(HalfToFloat(0x8001), -std::ldexp(1.0f, -24));
  CHECK_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  CHECK_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(HalfToFloat(0x7e00)));
  CHECK(std::isnan(HalfToFloat(0x7c01)));
  CHECK(std::isnan(HalfToFloat(0xfe00)));

  CHECK_EQ(FloatToHalf(0.0f), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(-0.0f), uint16_t{0x8000});
  CHECK_EQ(FloatToHalf(1.0f), uint16_t{0x3c00});
  CHECK_EQ(FloatToHalf(-2.0f), uint16_t{0xc000});
  CHECK_EQ(FloatToHalf(65504.0f), uint16_t{0x7bff});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), uint16_t{0xfc00});
  CHECK(IsHalfNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsHalfNan(FloatToHalf(-std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsHalfNan(FloatToHalf(FloatFromBits(0x7f800001u))));  // signalling NaN, tiny payload
}

TEST(HalfRoundToNearestEven) {
  using hvdkeras::FloatToHalf;
  const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0
  CHECK_EQ(FloatToHalf(1.0f + ulp1 / 2), uint16_t{0x3c00});          // tie -> even (down)
  CHECK_EQ(FloatToHalf(1.0f + 3 * ulp1 / 2), uint16_t{0x3c02});      // tie -> even (up)
  CHECK_EQ(FloatToHalf(std::nextafter(1.0f + ulp1 / 2, 2.0f)), uint16_t{0x3c01});  // above tie
  CHECK_EQ(FloatToHalf(std::nextafter(1.0f + 3 * ulp1 / 2, 0.0f)), uint16_t{0x3c01});
  CHECK_EQ(FloatToHalf(-(1.0f + ulp1 / 2)), uint16_t{0xbc00});
  CHECK_EQ(FloatToHalf(2047.5f), uint16_t{0x6800});  // 2047.5 -> 2048 (tie, 2047 odd)
  CHECK_EQ(FloatToHalf(2049.0f), uint16_t{0x6800});  // tie between 2048 and 2050 -> 2048
  CHECK_EQ(FloatToHalf(2051.0f), uint16_t{0x6802});  // tie between 2050 and 2052 -> 2052
  // Overflow boundary: 65519.99 -> 65504; 65520 is a tie with an odd
  // mantissa, so it rounds up, to infinity.
  CHECK_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), uint16_t{0x7bff});
  CHECK_EQ(FloatToHalf(65520.0f), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(-65520.0f), uint16_t{0xfc00});
  CHECK_EQ(FloatToHalf(1e6f), uint16_t{0x7c00});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::max()), uint16_t{0x7c00});
}

TEST(HalfSubnormals) {
  using hvdkeras::FloatToHalf;
  const float tiny = std::ldexp(1.0f, -24);  // smallest half subnormal
  CHECK_EQ(FloatToHalf(tiny), uint16_t{0x0001});
  CHECK_EQ(FloatToHalf(tiny / 2), uint16_t{0x0000});             // tie -> even (zero)
  CHECK_EQ(FloatToHalf(-tiny / 2), uint16_t{0x8000});
  CHECK_EQ(FloatToHalf(std::nextafter(tiny / 2, 1.0f)), uint16_t{0x0001});
  CHECK_EQ(FloatToHalf(std::nextafter(tiny / 2, 0.0f)), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(1.5f * tiny), uint16_t{0x0002});           // tie 1|2 -> 2
  CHECK_EQ(FloatToHalf(2.5f * tiny), uint16_t{0x0002});           // tie 2|3 -> 2
  CHECK_EQ(FloatToHalf(1023.5f * tiny), uint16_t{0x0400});        // rounds into the normals
  CHECK_EQ(FloatToHalf(1022.5f * tiny), uint16_t{0x03fe});
  CHECK_EQ(FloatToHalf(std::ldexp(1.0f, -14)), uint16_t{0x0400});
  CHECK_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), uint16_t{0x0000});
  CHECK_EQ(FloatToHalf(-std::numeric_limits<float>::min()), uint16_t{0x8000});
  for (uint16_t m = 1; m < 0x400; ++m) {  // every subnormal, both signs
    CHECK_EQ(hvdkeras::HalfToFloat(m), m * tiny);
    CHECK_EQ(hvdkeras::HalfToFloat(static_cast<uint16_t>(m | 0x8000u)), -(m * tiny));
  }
}

TEST(HalfRoundTripEveryValue) {
  int failures = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = hvdkeras::HalfToFloat(bits);
    const uint16_t back = hvdkeras::FloatToHalf(f);
    const bool ok = IsHalfNan(bits) ? (std::isnan(f) && IsHalfNan(back)) : back == bits;
    if (!ok && ++failures <= 5) {
      Fail(__FILE__, __LINE__, "half round trip of " + Show(bits) + " gave " + Show(back));
    }
    ++g_checks;
  }
}

TEST(HalfMatchesReferenceRounding) {
  // Every tie point between neighbouring finite halves and the floats just
  // either side of it...
  const int before = g_failures;
  for (uint32_t h = 0; h < 0x7c00u && g_failures - before < 10; ++h) {
    const double lo = hvdkeras::HalfToFloat(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00u ? 65536.0 : hvdkeras::HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      CheckHalfAgainstReference(f);
      CheckHalfAgainstReference(-f);
    }
  }
  // ...and a sweep over all float bit patterns.
  for (uint64_t bits = 0; bits <= 0xffffffffull && g_failures - before < 10; bits += 509) {
    CheckHalfAgainstReference(FloatFromBits(static_cast<uint32_t>(bits)));
  }
  g_checks += 1;
}

TEST(BFloat16KnownValuesAndRounding) {
  using hvdkeras::BFloat16ToFloat;
  using hvdkeras::FloatToBFloat16;
  CHECK_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  CHECK_EQ(BFloat16ToFloat(0xc040), -3.0f);
  CHECK_EQ(BFloat16ToFloat(0x7f7f), FloatFromBits(0x7f7f0000u));
  CHECK_EQ(BFloat16ToFloat(0x0001), FloatFromBits(0x00010000u));  // subnormal
  CHECK_EQ(BFloat16ToFloat(0x7f80), std::numeric_limits<float>::infinity());
  CHECK(std::isnan(BFloat16ToFloat(0x7fc0)));

  CHECK_EQ(FloatToBFloat16(1.0f), uint16_t{0x3f80});
  CHECK_EQ(FloatToBFloat16(-0.0f), uint16_t{0x8000});
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f808000u)), uint16_t{0x3f80});  // tie -> even
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f818000u)), uint16_t{0x3f82});  // tie -> even
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f808001u)), uint16_t{0x3f81});  // above tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x3f807fffu)), uint16_t{0x3f80});  // below tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x00008000u)), uint16_t{0x0000});  // subnormal tie
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x00018000u)), uint16_t{0x0002});
  CHECK_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), uint16_t{0x7f80});  // -> inf
  CHECK_EQ(FloatToBFloat16(FloatFromBits(0x7f7f7fffu)), uint16_t{0x7f7f});
  CHECK_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), uint16_t{0x7f80});
  CHECK_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), uint16_t{0xff80});
  // NaNs stay NaN, quiet, sign kept, even when the payload sits in the low bits.
  CHECK(IsBFloatNan(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(IsBFloatNan(FloatToBFloat16(FloatFromBits(0x7f800001u))));
  CHECK(IsBFloatNan(FloatToBFloat16(FloatFromBits(0xffffffffu))));
  CHECK((FloatToBFloat16(FloatFromBits(0xff800001u)) & 0x8000u) != 0);
  CHECK((FloatToBFloat16(FloatFromBits(0x7f800001u)) & 0x0040u) != 0);
}

TEST(BFloat16RoundTripAndReference) {
  int failures = 0;
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = hvdkeras::BFloat16ToFloat(bits);
    const uint16_t back = hvdkeras::FloatToBFloat16(f);
    const bool ok = IsBFloatNan(bits) ? IsBFloatNan(back) : back == bits;
    if (!ok && ++failures <= 5) {
      Fail(__FILE__, __LINE__, "bfloat16 round trip of " + Show(bits) + " gave " + Show(back));
    }
    ++g_checks;
  }
  const int before = g_failures;
  for (uint64_t bits = 0; bits <= 0xffffffffull && g_failures - before < 10; bits += 509) {
    CheckBFloatAgainstReference(FloatFromBits(static_cast<uint32_t>(bits)));
  }
  for (uint32_t b = 0; b < 0x7f80u && g_failures - before < 10; ++b) {  // every tie
    const uint32_t tie = (b << 16) | 0x8000u;
    for (uint32_t t : {tie - 1, tie, tie + 1}) {
      CheckBFloatAgainstReference(FloatFromBits(t));
      CheckBFloatAgainstReference(FloatFromBits(t | 0x80000000u));
    }
  }
}

// ==========================================================================
// ScaleCopy / FinalizeCopy
// ==========================================================================

std::vector<uint16_t> Halves(std::initializer_list<float> values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(hvdkeras::FloatToHalf(v));
  return out;
}

TEST(ScaleCopyFloat) {
  const std::vector<float> in = {1.0f, -2.5f, 0.0f, 3.0f};
  std::vector<float> out(4, 99.0f);
  hvdkeras::ScaleCopy(DataType::kFloat32, in.data(), out.data(), 4, 2.0);
  CHECK_EQ(out, (std::vector<float>{2.0f, -5.0f, 0.0f, 6.0f}));
  // In place.
  std::vector<float> buf = in;
  hvdkeras::ScaleCopy(DataType::kFloat32, buf.data(), buf.data(), 4, 0.5);
  CHECK_EQ(buf, (std::vector<float>{0.5f, -1.25f, 0.0f, 1.5f}));
  // Factor 1 is a bit-exact copy (NaN payloads included).
  const std::vector<uint32_t> raw = {0x7fc01234u, 0x3f800000u, 0x80000000u};
  std::vector<uint32_t> copy(3, 0);
  hvdkeras::ScaleCopy(DataType::kFloat32, raw.data(), copy.data(), 3, 1.0);
  CHECK_EQ(copy, raw);
  // float64 keeps double precision.
  const std::vector<double> d = {1.0 / 3.0, 1e300};
  std::vector<double> dout(2);
  hvdkeras::ScaleCopy(DataType::kFloat64, d.data(), dout.data(), 2, 3.0);
  CHECK_EQ(dout, (std::vector<double>{1.0 / 3.0 * 3.0, 3e300}));
  // Count 0 touches nothing.
  hvdkeras::ScaleCopy(DataType::kFloat32, in.data(), out.data(), 0, 5.0);
  CHECK_EQ(out[0], 2.0f);
}

TEST(ScaleCopyIntegers) {
  // Scaled integers truncate toward zero.
  const std::vector<int32_t> in = {5, -5, 7, 100};
  std::vector<int32_t> out(4);
  hvdkeras::ScaleCopy(DataType::kInt32, in.data(), out.data(), 4, 0.5);
  CHECK_EQ(out, (std::vector<int32_t>{2, -2, 3, 50}));
  const std::vector<int64_t> big = {int64_t{1} << 40};
  std::vector<int64_t> big_out(1);
  hvdkeras::ScaleCopy(DataType::kInt64, big.data(), big_out.data(), 1, 4.0);
  CHECK_EQ(big_out[0], int64_t{1} << 42);
  const std::vector<uint8_t> bytes = {10, 255};
  std::vector<uint8_t> bytes_out(2);
  hvdkeras::ScaleCopy(DataType::kUInt8, bytes.data(), bytes_out.data(), 2, 0.5);
  CHECK_EQ(bytes_out, (std::vector<uint8_t>{5, 127}));
}

TEST(ScaleCopyHalfPrescale) {
  const std::vector<uint16_t> in = Halves({1.0f, 2.0f, -0.5f, 65504.0f, 3.0f});
  std::vector<uint16_t> out(in.size());
  hvdkeras::ScaleCopy(DataType::kFloat16, in.data(), out.data(), in.size(), 0.5);
  CHECK_EQ(out, Halves({0.5f, 1.0f, -0.25f, 32752.0f, 1.5f}));
  hvdkeras::ScaleCopy(DataType::kFloat16, in.data(), out.data(), in.size(), 2.0);
  CHECK_EQ(out, (std::vector<uint16_t>{0x4000, 0x4400, 0xbc00, 0x7c00, 0x4600}));  // 65504*2 = inf
  // Rounding of the scaled value is to nearest even, into the subnormals too.
  const std::vector<uint16_t> sub = {0x0001, 0x0003, 0x0005, 0x3c01};
  std::vector<uint16_t> sub_out(sub.size());
  hvdkeras::ScaleCopy(DataType::kFloat16, sub.data(), sub_out.data(), sub.size(), 0.5);
  // 0.5 -> 0 (tie, even), 1.5 -> 2, 2.5 -> 2, (1 + 2^-10) / 2 exact.
  CHECK_EQ(sub_out, (std::vector<uint16_t>{0x0000, 0x0002, 0x0002, 0x3801}));
  // In place, with a factor that is not a power of two.
  std::vector<uint16_t> buf = Halves({3.0f, -6.0f});
  hvdkeras::ScaleCopy(DataType::kFloat16, buf.data(), buf.data(), 2, 1.0 / 3.0);
  CHECK_EQ(buf, Halves({1.0f, -2.0f}));
  // NaN and infinity pass through a scale.
  const std::vector<uint16_t> special = {0x7c00, 0xfc00, 0x7e00};
  std::vector<uint16_t> special_out(3);
  hvdkeras::ScaleCopy(DataType::kFloat16, special.data(), special_out.data(), 3, 0.5);
  CHECK_EQ(special_out[0], uint16_t{0x7c00});
  CHECK_EQ(special_out[1], uint16_t{0xfc00});
  CHECK(IsHalfNan(special_out[2]));
}

TEST(ScaleCopyHalfRoundsOnce) {
  // 1 * (1 + 2^-11 + 2^-30) lies just above the midpoint between 1 and the
  // next half (1 + 2^-10): the correct result rounds up. Rounding to float
  // first would land exactly on the midpoint and then round down to even.
  const std::vector<uint16_t> one = {0x3c00};
  std::vector<uint16_t> out(1);
  hvdkeras::ScaleCopy(DataType::kFloat16, one.data(), out.data(), 1,
                      1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30));
  CHECK_EQ(out[0], uint16_t{0x3c01});
  const std::vector<uint16_t> bf_one = {0x3f80};
  hvdkeras::ScaleCopy(DataType::kBFloat16, bf_one.data(), out.data(), 1,
                      1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30));
  CHECK_EQ(out[0], uint16_t{0x3f81});
}

TEST(ScaleCopyBFloat16) {
  const std::vector<uint16_t> in = {0x3f80, 0xc000};  // 1, -2
  std::vector<uint16_t> out(2);
  hvdkeras::ScaleCopy(DataType::kBFloat16, in.data(), out.data(), 2, 3.0);
  CHECK_EQ(out, (std::vector<uint16_t>{0x4040, 0xc0c0}));  // 3, -6
}

TEST(FinalizeCopyIntegerAverageRoundsTowardZero) {
  const std::vector<int32_t> in = {7, -7, 4, -1, 1, 0};
  std::vector<int32_t> out(in.size());
  hvdkeras::FinalizeCopy(DataType::kInt32, in.data(), out.data(), in.size(), 2, 1.0);
  CHECK_EQ(out, (std::vector<int32_t>{3, -3, 2, 0, 0, 0}));
  hvdkeras::FinalizeCopy(DataType::kInt32, in.data(), out.data(), in.size(), 3, 1.0);
  CHECK_EQ(out, (std::vector<int32_t>{2, -2, 1, 0, 0, 0}));
  // int64 averages stay exact beyond 2^53 (no trip through double).
  const std::vector<int64_t> big = {(int64_t{1} << 60) + 3, -((int64_t{1} << 60) + 3)};
  std::vector<int64_t> big_out(2);
  hvdkeras::FinalizeCopy(DataType::kInt64, big.data(), big_out.data(), 2, 3, 1.0);
  CHECK_EQ(big_out, (std::vector<int64_t>{((int64_t{1} << 60) + 3) / 3,
                                          -(((int64_t{1} << 60) + 3) / 3)}));
  const std::vector<int8_t> small = {-128, 127, -1};
  std::vector<int8_t> small_out(3);
  hvdkeras::FinalizeCopy(DataType::kInt8, small.data(), small_out.data(), 3, 3, 1.0);
  CHECK_EQ(small_out, (std::vector<int8_t>{-42, 42, 0}));
  const std::vector<uint8_t> bytes = {255, 3};
  std::vector<uint8_t> bytes_out(2);
  hvdkeras::FinalizeCopy(DataType::kUInt8, bytes.data(), bytes_out.data(), 2, 2, 1.0);
  CHECK_EQ(bytes_out, (std::vector<uint8_t>{127, 1}));
  // In place.
  std::vector<int32_t> buf = {9, -9};
  hvdkeras::FinalizeCopy(DataType::kInt32, buf.data(), buf.data(), 2, 4, 1.0);
  CHECK_EQ(buf, (std::vector<int32_t>{2, -2}));
  // With a postscale the quotient is not truncated before scaling.
  buf = {7};
  hvdkeras::FinalizeCopy(DataType::kInt32, buf.data(), buf.data(), 1, 2, 2.0);
  CHECK_EQ(buf[0], 7);
}

TEST(FinalizeCopyFloat) {
  const std::vector<float> in = {3.0f, 1.0f, -6.0f};
  std::vector<float> out(3);
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 3, 1.0);
  CHECK_EQ(out, (std::vector<float>{1.0f, static_cast<float>(1.0 / 3.0), -2.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 1, 2.0);  // postscale only
  CHECK_EQ(out, (std::vector<float>{6.0f, 2.0f, -12.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 2, 4.0);
  CHECK_EQ(out, (std::vector<float>{6.0f, 2.0f, -12.0f}));
  // divisor 1, factor 1: plain copy, in place is a no-op.
  std::vector<float> buf = in;
  hvdkeras::FinalizeCopy(DataType::kFloat32, buf.data(), buf.data(), 3, 1, 1.0);
  CHECK_EQ(buf, in);
  hvdkeras::FinalizeCopy(DataType::kFloat32, in.data(), out.data(), 3, 1, 1.0);
  CHECK_EQ(out, in);
  // float64 average: 0.1 + 0.2 + 0.3 summed then divided.
  const std::vector<double> d = {0.6, 1e-300};
  std::vector<double> dout(2);
  hvdkeras::FinalizeCopy(DataType::kFloat64, d.data(), dout.data(), 2, 3, 1.0);
  CHECK_EQ(dout, (std::vector<double>{0.6 / 3, 1e-300 / 3}));
}

TEST(FinalizeCopyHalfAndBFloat16) {
  // Average of a float16 sum: 3.0 / 2 = 1.5; 1.0 / 3 rounds to nearest half.
  const std::vector<uint16_t> in = Halves({3.0f, 1.0f, -65504.0f});
  std::vector<uint16_t> out(3);
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 2, 1.0);
  CHECK_EQ(out, Halves({1.5f, 0.5f, -32752.0f}));
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 3, 1.0);
  CHECK_EQ(out[0], uint16_t{0x3c00});
  CHECK_EQ(out[1], uint16_t{0x3555});  // 1/3 in half
  // Postscale on top of the average.
  hvdkeras::FinalizeCopy(DataType::kFloat16, in.data(), out.data(), 3, 2, 0.5);
  CHECK_EQ(out, Halves({0.75f, 0.25f, -16376.0f}));
  // bfloat16: 3 / 2 = 1.5.
  const std::vector<uint16_t> b = {0x4040};
  std::vector<uint16_t> bout(1);
  hvdkeras::FinalizeCopy(DataType::kBFloat16, b.data(), bout.data(), 1, 2, 1.0);
  CHECK_EQ(bout[0], uint16_t{0x3fc0});
}

TEST(FillNeutralElements) {
  // Sum and Average: zero; Product: one; Min: the largest value; Max: the lowest.
  std::vector<float> f(3, 9.0f);
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kSum, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{0, 0, 0}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kAverage, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{0, 0, 0}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kProduct, f.data(), 3);
  CHECK_EQ(f, (std::vector<float>{1, 1, 1}));
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kMin, f.data(), 3);
  CHECK_EQ(f[0], std::numeric_limits<float>::infinity());
  hvdkeras::FillNeutral(DataType::kFloat32, ReduceOp::kMax, f.data(), 3);
  CHECK_EQ(f[2], -std::numeric_limits<float>::infinity());

  std::vector<double> d(2, 5.0);
  hvdkeras::FillNeutral(DataType::kFloat64, ReduceOp::kMin, d.data(), 2);
  CHECK_EQ(d[1], std::numeric_limits<double>::infinity());

  std::vector<int64_t> i64(2, 5);
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kMin, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>(2, std::numeric_limits<int64_t>::max())));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kMax, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>(2, std::numeric_limits<int64_t>::min())));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kProduct, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>{1, 1}));
  hvdkeras::FillNeutral(DataType::kInt64, ReduceOp::kSum, i64.data(), 2);
  CHECK_EQ(i64, (std::vector<int64_t>{0, 0}));

  std::vector<int32_t> i32(1);
  hvdkeras::FillNeutral(DataType::kInt32, ReduceOp::kMin, i32.data(), 1);
  CHECK_EQ(i32[0], std::numeric_limits<int32_t>::max());
  hvdkeras::FillNeutral(DataType::kInt32, ReduceOp::kMax, i32.data(), 1);
  CHECK_EQ(i32[0], std::numeric_limits<int32_t>::min());
  std::vector<int8_t> i8(1);
  hvdkeras::FillNeutral(DataType::kInt8, ReduceOp::kMax, i8.data(), 1);
  CHECK_EQ(i8[0], int8_t{-128});
  std::vector<uint8_t> u8(1);
  hvdkeras::FillNeutral(DataType::kUInt8, ReduceOp::kMin, u8.data(), 1);
  CHECK_EQ(u8[0], uint8_t{255});
  hvdkeras::FillNeutral(DataType::kUInt8, ReduceOp::kMax, u8.data(), 1);
  CHECK_EQ(u8[0], uint8_t{0});

  std::vector<uint16_t> h(2);
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kMin, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x7c00, 0x7c00}));
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kMax, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0xfc00, 0xfc00}));
  hvdkeras::FillNeutral(DataType::kFloat16, ReduceOp::kProduct, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x3c00, 0x3c00}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kMin, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x7f80, 0x7f80}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kProduct, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0x3f80, 0x3f80}));
  hvdkeras::FillNeutral(DataType::kBFloat16, ReduceOp::kSum, h.data(), 2);
  CHECK_EQ(h, (std::vector<uint16_t>{0, 0}));
}

// ---- Output block pool ----------------------------------------------------

TEST(BlockPoolAlignsAndReuses) {
  hvdkeras::BlockPool pool(1 << 20);
  CHECK_EQ(hvdkeras::AlignUp(0), int64_t{0});
  CHECK_EQ(hvdkeras::AlignUp(1), int64_t{64});
  CHECK_EQ(hvdkeras::AlignUp(64), int64_t{64});
  CHECK_EQ(hvdkeras::AlignUp(65), int64_t{128});
  char* first = nullptr;
  {
    std::shared_ptr<char> block = pool.Acquire(1000);
    CHECK(block != nullptr);
    first = block.get();
    CHECK_EQ(reinterpret_cast<uintptr_t>(first) % 64, uintptr_t{0});
    std::memset(first, 7, 1000);  // the whole request is usable
    std::shared_ptr<char> view = block;  // an output still holds it
    block.reset();
    CHECK_EQ(pool.cached_blocks(), int64_t{0});
  }
  CHECK_EQ(pool.cached_blocks(), int64_t{1});
  CHECK_EQ(pool.cached_bytes(), int64_t{1024});
  // The released block serves the next request that fits it.
  std::shared_ptr<char> again = pool.Acquire(900);
  CHECK(again.get() == first);
  CHECK_EQ(pool.cached_blocks(), int64_t{0});
  // A block over twice the request is not handed out for it.
  again.reset();
  std::shared_ptr<char> small = pool.Acquire(100);
  CHECK(small.get() != first);
  CHECK_EQ(pool.cached_blocks(), int64_t{1});
}

TEST(BlockPoolKeepsAtMostItsLimit) {
  hvdkeras::BlockPool pool(4096);
  std::shared_ptr<char> a = pool.Acquire(3000);
  std::shared_ptr<char> b = pool.Acquire(3000);
  a.reset();
  b.reset();  // would exceed 4096 cached bytes: freed instead
  CHECK_EQ(pool.cached_blocks(), int64_t{1});
  CHECK_EQ(pool.cached_bytes(), int64_t{3008});
}

TEST(BlockPoolBlocksOutliveThePool) {
  // Outputs may be released on any thread, after the engine has gone.
  std::shared_ptr<char> survivor;
  {
    hvdkeras::BlockPool pool(1 << 20);
    survivor = pool.Acquire(256);
    std::shared_ptr<char> cached = pool.Acquire(128);
  }
  std::memset(survivor.get(), 1, 256);
  std::thread([block = std::move(survivor)]() mutable { block.reset(); }).join();
  CHECK(survivor == nullptr);
}

// ---- Reduction kernels (shared-memory allreduce) ---------------------------

TEST(ReduceIntoEveryOpOnFloats) {
  const std::vector<float> a{1, -2, 3.5f, 0};
  const std::vector<float> b{4, 5, -1, 0};
  std::vector<float> d = a;
  CHECK(hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kSum, d.data(), b.data(), 4));
  CHECK_EQ(d, (std::vector<float>{5, 3, 2.5f, 0}));
  d = a;
  CHECK(hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kAverage, d.data(), b.data(), 4));
  CHECK_EQ(d, (std::vector<float>{5, 3, 2.5f, 0}));  // averaging divides later
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kMin, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{1, -2, -1, 0}));
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kMax, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{4, 5, 3.5f, 0}));
  d = a;
  hvdkeras::ReduceInto(DataType::kFloat32, ReduceOp::kProduct, d.data(), b.data(), 4);
  CHECK_EQ(d, (std::vector<float>{4, -10, -3.5f, 0}));
  std::vector<double> x{1.5, 2}, y{0.25, -4};
  hvdkeras::ReduceInto(DataType::kFloat64, ReduceOp::kSum, x.data(), y.data(), 2);
  CHECK_EQ(x, (std::vector<double>{1.75, -2}));
}

TEST(ReduceIntoSeparateDestinationAndLongBuffers) {
  // dst = a (op) b with dst distinct from both, over a length that leaves a
  // tail after any vector width; a and b are left as they were.
  const int n = 1027;
  std::vector<float> a(n), b(n), d(n, -1.0f);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = static_cast<float>(n - i);
  }
  const std::vector<float> a0 = a, b0 = b;
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kSum, d.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(d[i], a[i] + b[i]);
  CHECK_EQ(a, a0);
  CHECK_EQ(b, b0);
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kMax, d.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(d[i], std::max(a[i], b[i]));
  // The destination may be the second operand too.
  CHECK(hvdkeras::Reduce(DataType::kFloat32, ReduceOp::kProduct, b.data(), a.data(), b.data(), n));
  for (int i = 0; i < n; ++i) CHECK_EQ(b[i], a0[i] * b0[i]);
  std::vector<int32_t> x{7, -3, 2}, y{1, 1, 1}, z(3);
  CHECK(hvdkeras::Reduce(DataType::kInt32, ReduceOp::kMin, z.data(), x.data(), y.data(), 3));
  CHECK_EQ(z, (std::vector<int32_t>{1, -3, 1}));
  CHECK(!hvdkeras::Reduce(DataType::kBool, ReduceOp::kSum, z.data(), x.data(), y.data(), 1));
}

TEST(ReduceIntoIntegersWrapLikeMpi) {
  std::vector<int8_t> a{100, -100, 7}, b{100, -100, -9};
  hvdkeras::ReduceInto(DataType::kInt8, ReduceOp::kSum, a.data(), b.data(), 3);
  CHECK_EQ(a, (std::vector<int8_t>{-56, 56, -2}));
  std::vector<uint8_t> u{250, 3}, v{10, 4};
  hvdkeras::ReduceInto(DataType::kUInt8, ReduceOp::kSum, u.data(), v.data(), 2);
  CHECK_EQ(u, (std::vector<uint8_t>{4, 7}));
  std::vector<int32_t> i{std::numeric_limits<int32_t>::max(), -5}, j{1, 3};
  hvdkeras::ReduceInto(DataType::kInt32, ReduceOp::kSum, i.data(), j.data(), 2);
  CHECK_EQ(i, (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -2}));
  std::vector<int64_t> k{-3, 6}, l{4, -2};
  hvdkeras::ReduceInto(DataType::kInt64, ReduceOp::kProduct, k.data(), l.data(), 2);
  CHECK_EQ(k, (std::vector<int64_t>{-12, -12}));
  hvdkeras::ReduceInto(DataType::kInt64, ReduceOp::kMin, k.data(), l.data(), 2);
  CHECK_EQ(k, (std::vector<int64_t>{-12, -12}));
}

TEST(ReduceIntoHalfAndBFloat16) {
  using hvdkeras::FloatToHalf;
  using hvdkeras::HalfToFloat;
  std::vector<uint16_t> a{FloatToHalf(1.5f), FloatToHalf(-2.0f)};
  const std::vector<uint16_t> b{FloatToHalf(0.25f), FloatToHalf(8.0f)};
  hvdkeras::ReduceInto(DataType::kFloat16, ReduceOp::kSum, a.data(), b.data(), 2);
  CHECK_EQ(HalfToFloat(a[0]), 1.75f);
  CHECK_EQ(HalfToFloat(a[1]), 6.0f);
  hvdkeras::ReduceInto(DataType::kFloat16, ReduceOp::kMax, a.data(), b.data(), 2);
  CHECK_EQ(HalfToFloat(a[0]), 1.75f);
  CHECK_EQ(HalfToFloat(a[1]), 8.0f);
  std::vector<uint16_t> c{hvdkeras::FloatToBFloat16(3.0f)};
  const std::vector<uint16_t> e{hvdkeras::FloatToBFloat16(-0.5f)};
  hvdkeras::ReduceInto(DataType::kBFloat16, ReduceOp::kProduct, c.data(), e.data(), 1);
  CHECK_EQ(hvdkeras::BFloat16ToFloat(c[0]), -1.5f);
  bool reduced = hvdkeras::ReduceInto(DataType::kBool, ReduceOp::kSum, c.data(), e.data(), 1);
  CHECK(!reduced);
}

}  // namespace

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional: run one test by name
  int ran = 0;
  for (const TestCase& t : Registry()) {
    if (only && std::strcmp(only, t.name) != 0) continue;
    g_current_test = t.name;
    const int before = g_failures;
    t.fn();
    ++ran;
    std::printf("[%s] %s\n", g_failures == before ? " OK " : "FAIL", t.name);
  }
  std::printf("%d tests, %d checks, %d failures\n", ran, g_checks, g_failures);
  if (ran == 0) {
    std::fprintf(stderr, "no test matched\n");
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}

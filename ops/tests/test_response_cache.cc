// Unit tests of the response cache (core/response_cache.cc): lookups, LRU
// eviction, slot reuse, and two caches fed the same sequence staying
// identical (see Note [identical response caches]).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/response_cache.h"
#include "tests/harness.h"
#include "tests/requests.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::OpType;
using hvdkeras::Request;
using hvdkeras::Response;
using hvdkeras::Shape;
using test_harness::Lcg;
using test_harness::g_failures;
using test_harness::MakeRequest;

// ==========================================================================
// ResponseCache
// ==========================================================================

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

// Note [classified once]: an op may keep its slot only while the slot holds
// the entry it found, so every change to a slot must change its version.
TEST(CacheVersionChangesWithEveryPutAndEraseOfItsSlot) {
  hvdkeras::ResponseCache cache(2);
  PutReq(cache, MakeRequest("a", {2}));
  PutReq(cache, MakeRequest("b", {2}));
  const uint64_t a = cache.Version(0), b = cache.Version(1);
  CHECK(cache.Unchanged(0, a));
  CHECK(cache.Unchanged(1, b));
  CHECK(!cache.Unchanged(-1, a));
  CHECK(!cache.Unchanged(5, a));
  cache.Touch(0);  // use alone changes nothing
  CHECK(cache.Unchanged(0, a));
  PutReq(cache, MakeRequest("a", {3}));  // refreshed in place
  CHECK_EQ(cache.Lookup("a"), 0);
  CHECK(!cache.Unchanged(0, a));
  CHECK(cache.Unchanged(1, b));
  const uint64_t a2 = cache.Version(0);
  cache.Erase(0);
  CHECK(!cache.Unchanged(0, a2));
  PutReq(cache, MakeRequest("c", {2}));  // reuses slot 0 for another name
  CHECK_EQ(cache.Lookup("c"), 0);
  CHECK(!cache.Unchanged(0, a2));
  CHECK(!cache.Unchanged(0, a));
  PutReq(cache, MakeRequest("d", {2}));  // full: evicts b, the least recent
  CHECK_EQ(cache.Lookup("b"), -1);
  CHECK(!cache.Unchanged(1, b));
}

}  // namespace

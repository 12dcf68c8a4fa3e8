// Unit tests of the output block pool (core/block_pool.cc): alignment,
// reuse, its limit, and blocks outliving the pool (Note [fused outputs]).
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "core/block_pool.h"
#include "tests/harness.h"

namespace {

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
  std::shared_ptr<char> c = pool.Acquire(1000);
  char* kept = b.get();
  a.reset();
  c.reset();
  b.reset();  // would exceed 4096 cached bytes: the older blocks make room
  CHECK_EQ(pool.cached_blocks(), int64_t{1});
  CHECK_EQ(pool.cached_bytes(), int64_t{3008});
  CHECK(pool.Acquire(3000).get() == kept);
  std::shared_ptr<char> huge = pool.Acquire(5000);
  huge.reset();  // over the limit by itself: freed
  CHECK(pool.cached_bytes() <= 4096);
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

}  // namespace

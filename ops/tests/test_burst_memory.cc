// Unit tests of the burst memory (core/burst_memory.cc): which pending ops
// make the engine wait for companions (Note [burst gathering]).
#include <string>
#include <vector>

#include "core/burst_memory.h"
#include "tests/harness.h"

namespace {

void CountAll(hvdkeras::BurstMemory& memory, const std::vector<std::string>& names) {
  memory.BeginCount();
  for (const std::string& name : names) memory.Count(name);
}

TEST(BurstUnknownOpsNeverWait) {
  hvdkeras::BurstMemory memory;
  CountAll(memory, {"a", "b"});
  CHECK(!memory.Incomplete());
}

TEST(BurstWaitsUntilEveryMemberIsPending) {
  hvdkeras::BurstMemory memory;
  memory.Remember({"a", "b", "c"});
  memory.BeginCount();
  CHECK(!memory.Incomplete());
  memory.Count("b");
  CHECK(memory.Incomplete());
  memory.Count("a");
  CHECK(memory.Incomplete());
  memory.Count("c");
  CHECK(!memory.Incomplete());
  // A name counted twice does not complete a burst twice over.
  memory.Count("c");
  CHECK(!memory.Incomplete());
}

TEST(BurstCountsStartAfreshEachCycle) {
  hvdkeras::BurstMemory memory;
  memory.Remember({"a", "b"});
  CountAll(memory, {"a", "b"});
  CHECK(!memory.Incomplete());
  CountAll(memory, {"a"});
  CHECK(memory.Incomplete());
}

TEST(BurstSingletonsNeverWait) {
  hvdkeras::BurstMemory memory;
  memory.Remember({"a"});
  memory.Remember({"b"});
  CountAll(memory, {"a"});
  CHECK(!memory.Incomplete());
}

TEST(BurstNamesMoveToTheirLatestBurst) {
  hvdkeras::BurstMemory memory;
  memory.Remember({"a", "b", "c"});
  // b ran on its own later: {a, c} still go together, b is waited for by no one.
  memory.Remember({"b"});
  CountAll(memory, {"a", "c"});
  CHECK(!memory.Incomplete());
  CountAll(memory, {"b"});
  CHECK(!memory.Incomplete());
  CountAll(memory, {"a"});
  CHECK(memory.Incomplete());
  // Every member moved on: the old burst is gone.
  memory.Remember({"a"});
  memory.Remember({"c"});
  CountAll(memory, {"a"});
  CHECK(!memory.Incomplete());
  CHECK_EQ(memory.remembered(), size_t{3});
}

TEST(BurstSeveralBurstsAtOnce) {
  hvdkeras::BurstMemory memory;
  memory.Remember({"a", "b"});
  memory.Remember({"x", "y", "z"});
  CountAll(memory, {"a", "b", "x"});
  CHECK(memory.Incomplete());
  memory.Count("y");
  memory.Count("z");
  CHECK(!memory.Incomplete());
}

TEST(BurstRememberingTheSameBurstAgainChangesNothing) {
  // The usual step remembers what it remembered last time (a shortcut in
  // Remember): the burst stays whole, and a part of it still waits.
  hvdkeras::BurstMemory memory;
  memory.Remember({"a", "b", "c"});
  memory.Remember({"a", "b", "c"});
  memory.Remember({"c", "a", "b"});
  CountAll(memory, {"a", "b"});
  CHECK(memory.Incomplete());
  CHECK_EQ(memory.missing(), size_t{1});
  // A subset is not the same burst: it splits off, and c then runs alone.
  memory.Remember({"a", "b"});
  CountAll(memory, {"a", "b"});
  CHECK(!memory.Incomplete());
  CountAll(memory, {"c"});
  CHECK(!memory.Incomplete());
}

}  // namespace

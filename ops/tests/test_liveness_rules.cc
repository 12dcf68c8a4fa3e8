// Unit tests of host liveness's pure rules (core/liveness_rules.cc): the
// bound, the beat, and which hosts rank 0 takes for lost.
#include <map>
#include <string>
#include <vector>

#include "core/liveness_rules.h"
#include "tests/harness.h"

namespace {

using hvdkeras::FindLostHosts;

TEST(TheBoundIsAtMostHalfTheStallBound) {
  CHECK_EQ(hvdkeras::LivenessBound(60.0, 1800.0), 60.0);
  CHECK_EQ(hvdkeras::LivenessBound(60.0, 30.0), 15.0);
  CHECK_EQ(hvdkeras::LivenessBound(60.0, 0.0), 60.0);  // no stall bound: liveness alone
  CHECK_EQ(hvdkeras::LivenessBound(0.0, 30.0), 0.0);   // off
}

TEST(BeatsComeEverySecondOrATenthOfTheBound) {
  CHECK_EQ(hvdkeras::BeatInterval(60.0), 1.0);
  CHECK_EQ(hvdkeras::BeatInterval(5.0), 0.5);
  CHECK_EQ(hvdkeras::BeatInterval(0.1), 0.05);
}

TEST(AHostIsLostOnlyWhenNoneOfItsRanksWasHeard) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b", "c"};
  // Rank 2 fell silent but rank 3 on the same host still beats: b is alive.
  std::map<int, double> heard = {{2, 10.0}, {3, 99.0}, {4, 99.5}};
  auto lost = FindLostHosts(hosts, heard, 100.0, 20.0);
  CHECK(lost.hosts.empty());
  CHECK(lost.ranks.empty());
  heard[3] = 50.0;  // now both are silent past the bound
  lost = FindLostHosts(hosts, heard, 100.0, 20.0);
  CHECK_EQ(lost.hosts.size(), size_t{1});
  CHECK_EQ(lost.hosts[0], std::string("b"));
  CHECK(lost.ranks == (std::vector<int>{2, 3}));
  CHECK_EQ(lost.silent_seconds, 50.0);  // the newest of the host's beats counts
}

TEST(SilenceExactlyAtTheBoundIsNotYetLoss) {
  const std::vector<std::string> hosts = {"a", "b"};
  auto lost = FindLostHosts(hosts, {{1, 80.0}}, 100.0, 20.0);
  CHECK(lost.hosts.empty());
  lost = FindLostHosts(hosts, {{1, 79.0}}, 100.0, 20.0);
  CHECK(lost.ranks == (std::vector<int>{1}));
}

TEST(ALostHostNamesEveryRankOnItThoughOnlyItsLeaderIsWatched) {
  const std::vector<std::string> hosts = {"a", "b", "b", "b", "c"};
  auto lost = FindLostHosts(hosts, {{1, 10.0}, {4, 99.0}}, 100.0, 20.0);
  CHECK(lost.hosts == (std::vector<std::string>{"b"}));
  CHECK(lost.ranks == (std::vector<int>{1, 2, 3}));
}

TEST(TheTreeHasOneLeaderPerHostAndNothingWatchedOnRankZerosHost) {
  const std::vector<std::string> hosts = {"a", "b", "a", "b", "c", "c", "b"};
  const hvdkeras::LivenessTree tree = hvdkeras::PlanLivenessTree(hosts);
  CHECK(tree.leader == (std::vector<int>{0, 1, 0, 1, 4, 4, 1}));
  CHECK(tree.watched == (std::vector<bool>{false, true, false, true, true, true, true}));
  CHECK(tree.leaders == (std::vector<int>{1, 4}));
  CHECK_EQ(tree.ReportsTo(0), 2);  // one per other host, not one per rank
  CHECK_EQ(tree.ReportsTo(1), 2);
  CHECK_EQ(tree.ReportsTo(4), 1);
  CHECK_EQ(tree.ReportsTo(3), 0);
  CHECK_EQ(tree.ReportsTo(2), 0);  // on rank 0's host
}

TEST(RankZeroOfSixteenThousandRanksOnTwoThousandHostsHoldsAConnectionPerHost) {
  std::vector<std::string> hosts;
  for (int r = 0; r < 16384; ++r) hosts.push_back("node" + std::to_string(r / 8));
  const hvdkeras::LivenessTree tree = hvdkeras::PlanLivenessTree(hosts);
  CHECK_EQ(tree.ReportsTo(0), 2047);
  CHECK_EQ(tree.ReportsTo(8), 7);
}

TEST(TheDescriptorLimitRisesOnlyWhenShortAndOnlyUnderTheHardLimit) {
  CHECK_EQ(hvdkeras::DescriptorLimitFor(40, 100, 1024, 4096), 0L);  // room already
  CHECK_EQ(hvdkeras::DescriptorLimitFor(40, 1500, 1024, 524288), 40L + 1500 + 375);
  CHECK_EQ(hvdkeras::DescriptorLimitFor(40, 1500, 1024, 1100), -1L);
  CHECK_EQ(hvdkeras::DescriptorLimitFor(40, 1500, 1024, -1), 40L + 1500 + 375);  // unlimited
}

TEST(RanksOutsideTheWorldAreIgnored) {
  const std::vector<std::string> hosts = {"a", "b"};
  auto lost = FindLostHosts(hosts, {{7, 0.0}, {-1, 0.0}}, 100.0, 20.0);
  CHECK(lost.hosts.empty());
}

}  // namespace

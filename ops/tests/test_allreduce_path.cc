// Unit tests of the allreduce path policy (core/allreduce_path.cc): the host
// layout from every rank's host, and which way each layout and setting takes
// (Note [hierarchical allreduce]).
#include <string>
#include <vector>

#include "core/allreduce_path.h"
#include "tests/harness.h"

namespace {

using hvdkeras::AllreducePath;
using hvdkeras::HostLayout;

AllreducePath Choose(const std::vector<int>& hosts, bool shm, const std::string& setting) {
  AllreducePath path = AllreducePath::kMpi;
  CHECK(hvdkeras::ChooseAllreducePath(hvdkeras::LayoutOf(hosts), shm, setting, &path));
  return path;
}

TEST(LayoutCountsRanksPerHostInAnyRankOrder) {
  const HostLayout blocks = hvdkeras::LayoutOf({0, 0, 1, 1});
  CHECK_EQ(blocks.hosts, 2);
  CHECK_EQ(blocks.min_local_size, 2);
  CHECK_EQ(blocks.max_local_size, 2);
  const HostLayout round_robin = hvdkeras::LayoutOf({0, 1, 2, 0});
  CHECK_EQ(round_robin.hosts, 3);
  CHECK_EQ(round_robin.min_local_size, 1);
  CHECK_EQ(round_robin.max_local_size, 2);
  const HostLayout one = hvdkeras::LayoutOf({0});
  CHECK_EQ(one.hosts, 1);
  CHECK_EQ(one.max_local_size, 1);
}

TEST(OneHostUsesSharedMemoryWhateverTheHierarchicalSetting) {
  for (const char* setting : {"auto", "on", "off"}) {
    CHECK(Choose({0, 0, 0}, true, setting) == AllreducePath::kShm);
    CHECK(Choose({0, 0, 0}, false, setting) == AllreducePath::kMpi);
  }
  CHECK(Choose({0}, true, "on") == AllreducePath::kMpi);  // one rank: nothing to share
}

TEST(AutoGoesHierarchicalWhenSomeHostHasSeveralRanks) {
  CHECK(Choose({0, 0, 1, 1}, true, "auto") == AllreducePath::kHierarchical);
  CHECK(Choose({0, 1, 2, 0}, true, "auto") == AllreducePath::kHierarchical);
  CHECK(Choose({0, 1, 2}, true, "auto") == AllreducePath::kMpi);  // one rank per host
}

TEST(OnAndOffOverrideAutoAcrossHosts) {
  CHECK(Choose({0, 1, 2}, true, "on") == AllreducePath::kHierarchical);
  CHECK(Choose({0, 0, 1, 1}, true, "off") == AllreducePath::kMpi);
  CHECK(Choose({0, 0, 1, 1}, false, "on") == AllreducePath::kMpi);  // needs shared memory
}

TEST(UnknownSettingIsRefused) {
  AllreducePath path = AllreducePath::kShm;
  CHECK(!hvdkeras::ChooseAllreducePath(hvdkeras::LayoutOf({0, 1}), true, "yes", &path));
  CHECK(path == AllreducePath::kShm);
  CHECK_EQ(std::string(hvdkeras::AllreducePathName(AllreducePath::kHierarchical)),
           std::string("hierarchical"));
}

}  // namespace

#include "core/liveness_rules.h"

#include <algorithm>

namespace hvdkeras {

double LivenessBound(double liveness_seconds, double stall_shutdown_seconds) {
  if (liveness_seconds <= 0) return 0.0;
  return stall_shutdown_seconds > 0 ? std::min(liveness_seconds, stall_shutdown_seconds / 2)
                                    : liveness_seconds;
}

double BeatInterval(double bound) { return std::clamp(bound / 10.0, 0.05, 1.0); }

LostHosts FindLostHosts(const std::vector<std::string>& host_of_rank,
                        const std::map<int, double>& last_heard, double now, double bound) {
  std::map<std::string, double> newest;
  for (const auto& [rank, heard] : last_heard) {
    if (rank < 0 || rank >= static_cast<int>(host_of_rank.size())) continue;
    auto [it, added] = newest.emplace(host_of_rank[rank], heard);
    if (!added) it->second = std::max(it->second, heard);
  }
  LostHosts lost;
  for (const auto& [host, heard] : newest) {
    if (now - heard <= bound) continue;
    lost.hosts.push_back(host);
    lost.silent_seconds = std::max(lost.silent_seconds, now - heard);
  }
  if (lost.hosts.empty()) return lost;
  for (int rank = 0; rank < static_cast<int>(host_of_rank.size()); ++rank) {
    if (std::binary_search(lost.hosts.begin(), lost.hosts.end(), host_of_rank[rank])) {
      lost.ranks.push_back(rank);
    }
  }
  return lost;
}

int LivenessTree::ReportsTo(int rank) const {
  if (rank == 0) return static_cast<int>(leaders.size());
  if (rank < 0 || rank >= static_cast<int>(leader.size()) || !watched[rank] ||
      leader[rank] != rank) {
    return 0;
  }
  int members = 0;
  for (size_t r = 0; r < leader.size(); ++r) members += leader[r] == rank && r != size_t(rank);
  return members;
}

LivenessTree PlanLivenessTree(const std::vector<std::string>& host_of_rank) {
  LivenessTree tree;
  const int size = static_cast<int>(host_of_rank.size());
  std::map<std::string, int> first;
  tree.leader.resize(size);
  tree.watched.resize(size);
  for (int r = 0; r < size; ++r) {
    const int leader = first.emplace(host_of_rank[r], r).first->second;
    tree.leader[r] = leader;
    tree.watched[r] = host_of_rank[r] != host_of_rank[0];
    if (leader == r && tree.watched[r]) tree.leaders.push_back(r);
  }
  return tree;
}

long DescriptorLimitFor(long open_now, long needed, long soft, long hard) {
  // A quarter more, and at least 256, for what opens after start-up.
  const long want = open_now + needed + std::max(256L, needed / 4);
  if (want <= soft) return 0;
  if (hard >= 0 && want > hard) return -1;  // a negative hard limit: unlimited
  return want;
}

}  // namespace hvdkeras

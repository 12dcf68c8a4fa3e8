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
    for (const auto& [rank, when] : last_heard) {
      if (rank >= 0 && rank < static_cast<int>(host_of_rank.size()) &&
          host_of_rank[rank] == host) {
        lost.ranks.push_back(rank);
      }
    }
  }
  std::sort(lost.ranks.begin(), lost.ranks.end());
  return lost;
}

}  // namespace hvdkeras

// The pure rules of host liveness (Note [host liveness] in liveness.h): the
// bound it works to and which hosts count as lost. No MPI, no sockets.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace hvdkeras {

// `liveness_seconds`, at most half the stall bound when there is one, so that
// a cut link is answered by liveness before the stall bound fires;
// liveness_seconds <= 0 turns it off (0).
double LivenessBound(double liveness_seconds, double stall_shutdown_seconds);

// How often a rank beats at `bound`: a second, or a tenth of the bound when
// that is shorter (never under 50 ms).
double BeatInterval(double bound);

struct LostHosts {
  std::vector<std::string> hosts;  // in name order
  std::vector<int> ranks;          // ascending
  double silent_seconds = 0.0;     // the longest silence among them
};

// Rank 0's verdict: the hosts none of whose watched ranks (`last_heard`,
// rank -> when it was last heard) has been heard within `bound` of `now`.
// A host is heard when any of its ranks is; a lost host's ranks are all
// the ranks on it, watched or not (a host's leader speaks for them all).
LostHosts FindLostHosts(const std::vector<std::string>& host_of_rank,
                        const std::map<int, double>& last_heard, double now, double bound);

// Note [liveness tree]: each rank's place in it, from every rank's host.
// leader[r] is the lowest rank on r's host; watched[r] is false for the
// ranks on rank 0's host (nothing there is watched). Leaders of the other
// hosts report to rank 0, their hosts' other ranks to them.
struct LivenessTree {
  std::vector<int> leader;
  std::vector<bool> watched;
  std::vector<int> leaders;  // of the watched hosts, ascending
  // How many ranks report to `rank` (rank 0: the leaders; a leader: the
  // other ranks of its host; others: none).
  int ReportsTo(int rank) const;
};
LivenessTree PlanLivenessTree(const std::vector<std::string>& host_of_rank);

// What the file-descriptor limit must become for `needed` more descriptors
// on top of `open_now`, with room to spare for what MPI and the framework
// open later: 0 when the soft limit already covers it, the new soft limit
// when the hard one allows it, -1 when it does not.
long DescriptorLimitFor(long open_now, long needed, long soft, long hard);

}  // namespace hvdkeras

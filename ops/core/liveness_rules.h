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
// A host is heard when any of its ranks is.
LostHosts FindLostHosts(const std::vector<std::string>& host_of_rank,
                        const std::map<int, double>& last_heard, double now, double bound);

}  // namespace hvdkeras

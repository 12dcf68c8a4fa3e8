// The sockets of host liveness (Note [host liveness] in liveness.h): listening,
// connecting with a greeting that names the rank, accepting the greetings,
// and the descriptors all that needs. No MPI: the start-up exchange that
// tells each rank whom to reach is liveness_start.cc's.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

namespace hvdkeras {

// This host's IPv4 addresses: those on HVDKERAS_NETWORK_INTERFACES (the
// interfaces MPI was told to use) first, loopback last.
std::vector<std::string> OwnAddresses();

struct LivenessListener {
  int fd = -1;  // -1: could not listen
  int port = 0;
};
// A listening socket on every address (or on loopback only), with room in
// its queue for `backlog` connections at once.
LivenessListener ListenForPeers(bool loopback_only, int backlog);

// A non-blocking connected socket to the first of `addresses` that answers
// on `port`, which has been told `rank`; -1 when none did.
int ConnectAndGreet(const std::vector<std::string>& addresses, int port, int rank);

// Accepts connections on `listener` until every rank in `expected` has
// greeted or `seconds` passed; returns rank -> non-blocking socket. Closes
// the listener.
std::map<int, int> AcceptGreetings(LivenessListener* listener, std::set<int> expected,
                                   double seconds);

// Makes room for `needed` more descriptors: raises the soft limit
// (RLIMIT_NOFILE) when it is short and the hard limit allows. Returns "" or,
// when the hard limit is too low, why, naming the limits and `ulimit -n`.
std::string EnsureDescriptors(long needed, const std::string& what);

}  // namespace hvdkeras

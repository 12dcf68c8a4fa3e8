#include "core/liveness_start.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "core/liveness_links.h"

namespace hvdkeras {

namespace {

constexpr double kAcceptSeconds = 15.0;  // for the greetings of those that connected
constexpr int kOfferBytes = 1024;        // "port address address ..." or "!why"
constexpr int kHostBytes = 256;

}  // namespace

Status StartLiveness(MPI_Comm comm, double bound_seconds, Liveness* liveness) {
  liveness->Stop();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  double bound = bound_seconds > 0 ? bound_seconds : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &bound, 1, MPI_DOUBLE, MPI_MIN, comm);
  if (bound <= 0 || size == 1) return Status::OK();

  // Only rank 0 learns every host; each rank is told its own leader.
  char name[kHostBytes] = {};
  gethostname(name, kHostBytes - 1);
  std::vector<char> names(rank == 0 ? static_cast<size_t>(size) * kHostBytes : 0);
  MPI_Gather(name, kHostBytes, MPI_CHAR, names.data(), kHostBytes, MPI_CHAR, 0, comm);
  std::vector<std::string> hosts;
  LivenessTree tree;
  std::vector<int> my_leaders;  // rank 0: each rank's leader, -1 where unwatched
  if (rank == 0) {
    for (int r = 0; r < size; ++r) hosts.emplace_back(names.data() + r * kHostBytes);
    tree = PlanLivenessTree(hosts);
    for (int r = 0; r < size; ++r) my_leaders.push_back(tree.watched[r] ? tree.leader[r] : -1);
  }
  int leader = -1;
  MPI_Scatter(my_leaders.data(), 1, MPI_INT, &leader, 1, MPI_INT, 0, comm);

  // Rank 0 listens on every address and offers them all, with rank 0's host.
  std::vector<char> offer(kOfferBytes + kHostBytes, '\0');
  LivenessListener root_listener;
  if (rank == 0 && !tree.leaders.empty()) {
    const std::string refusal =
        EnsureDescriptors(static_cast<long>(tree.leaders.size()), "Host liveness on rank 0");
    std::string text;
    if (!refusal.empty()) {
      text = "!" + refusal;
    } else {
      root_listener = ListenForPeers(false, static_cast<int>(tree.leaders.size()));
      text = std::to_string(root_listener.port);
      for (const std::string& address : OwnAddresses()) {
        if (text.size() + address.size() + 1 < kOfferBytes) text += " " + address;
      }
    }
    std::memcpy(offer.data(), text.data(), std::min<size_t>(text.size(), kOfferBytes - 1));
    std::memcpy(offer.data() + kOfferBytes, name, kHostBytes - 1);
  }
  MPI_Bcast(offer.data(), static_cast<int>(offer.size()), MPI_CHAR, 0, comm);
  if (offer[0] == '\0') return Status::OK();  // one host: nothing is watched
  if (offer[0] == '!') {
    return Status::Error(StatusCode::kPreconditionError,
                         std::string(offer.data() + 1, strnlen(offer.data() + 1, kOfferBytes)));
  }
  const std::string root_host(offer.data() + kOfferBytes,
                              strnlen(offer.data() + kOfferBytes, kHostBytes));
  std::istringstream parsed(std::string(offer.data(), strnlen(offer.data(), kOfferBytes)));
  int root_port = 0;
  parsed >> root_port;
  std::vector<std::string> addresses;
  for (std::string a; parsed >> a;) addresses.push_back(a);

  // Each watched host's ranks: the leader listens on loopback for its
  // members and tells them the port.
  MPI_Comm host_comm = MPI_COMM_NULL;
  MPI_Comm_split(comm, leader >= 0 ? leader : MPI_UNDEFINED, rank, &host_comm);
  int members = 0;
  LivenessListener member_listener;
  int up_fd = -1;
  if (host_comm != MPI_COMM_NULL) {
    int host_size = 1;
    MPI_Comm_size(host_comm, &host_size);
    members = host_size - 1;
    int member_port = 0;
    if (rank == leader && members > 0) {
      // A leader that cannot make room leaves its members unwatched (its
      // host is still watched through its own connection).
      const std::string refusal = EnsureDescriptors(members, "Host liveness on a host's leader");
      if (refusal.empty()) member_listener = ListenForPeers(true, members);
      member_port = member_listener.port;
      if (!refusal.empty()) {
        std::fprintf(stderr, "hvdkeras: warning: rank %d: %s\n", rank, refusal.c_str());
      }
    }
    MPI_Bcast(&member_port, 1, MPI_INT, 0, host_comm);
    up_fd = rank == leader ? ConnectAndGreet(addresses, root_port, rank)
                           : ConnectAndGreet({"127.0.0.1"}, member_port, rank);
  }

  // Rank 0 accepts the leaders that say they connected; each leader its
  // members. What was accepted is told back, so that no rank waits for
  // beats that never come.
  int connected = up_fd >= 0 ? 1 : 0;
  std::vector<int> leader_connected(rank == 0 ? size : 0, 0);
  MPI_Gather(&connected, 1, MPI_INT, leader_connected.data(), 1, MPI_INT, 0, comm);
  std::vector<Liveness::Link> down;
  std::vector<int> accepted_by_root(rank == 0 ? size : 0, 0);
  if (rank == 0) {
    std::set<int> expected;
    for (int r : tree.leaders) {
      if (leader_connected[r]) expected.insert(r);
    }
    for (const auto& [peer, fd] : AcceptGreetings(&root_listener, expected, kAcceptSeconds)) {
      accepted_by_root[peer] = 1;
      down.push_back(Liveness::Link{fd, peer});
    }
    std::vector<int> missing;
    for (int r : tree.leaders) {
      if (!accepted_by_root[r]) missing.push_back(r);
    }
    if (!missing.empty()) {
      std::fprintf(stderr,
                   "hvdkeras: warning: rank(s) %s could not connect to rank 0's host (%s, "
                   "offered: %s) for host liveness, so a lost host among theirs (the ranks "
                   "there besides) is found only by HVDKERAS_STALL_SHUTDOWN_SECONDS (see "
                   "Note [host liveness]).\n",
                   RankListText(missing, 16).c_str(), root_host.c_str(), offer.data());
    }
    for (int r = 0; r < size; ++r) {
      // A member counts as taken when its leader was: the leader decides below.
      if (tree.watched[r] && tree.leader[r] != r) accepted_by_root[r] = 1;
    }
  }
  int taken = 0;
  MPI_Scatter(accepted_by_root.data(), 1, MPI_INT, &taken, 1, MPI_INT, 0, comm);
  Liveness::Link up{-1, -1};
  if (host_comm != MPI_COMM_NULL) {
    // Within the host: the leader's own standing, then its members' greetings.
    int leader_taken = taken;
    MPI_Bcast(&leader_taken, 1, MPI_INT, 0, host_comm);
    std::vector<int> member_connected(rank == leader ? members + 1 : 0, 0);
    int mine = connected;
    MPI_Gather(&mine, 1, MPI_INT, member_connected.data(), 1, MPI_INT, 0, host_comm);
    std::vector<int> member_taken(member_connected.size(), 0);
    std::vector<int> host_ranks(member_connected.size(), 0);
    MPI_Gather(&rank, 1, MPI_INT, host_ranks.data(), 1, MPI_INT, 0, host_comm);
    if (rank == leader) {
      std::set<int> expected;
      for (int i = 1; leader_taken && i <= members; ++i) {
        if (member_connected[i]) expected.insert(host_ranks[i]);
      }
      // With nothing expected this only closes the listener.
      const auto greeted = AcceptGreetings(&member_listener, expected, kAcceptSeconds);
      for (int i = 1; i <= members; ++i) {
        auto it = greeted.find(host_ranks[i]);
        if (it == greeted.end()) continue;
        member_taken[i] = 1;
        down.push_back(Liveness::Link{it->second, host_ranks[i]});
      }
    }
    int member_ok = 0;
    MPI_Scatter(member_taken.data(), 1, MPI_INT, &member_ok, 1, MPI_INT, 0, host_comm);
    const bool keep = rank == leader ? leader_taken != 0 : member_ok != 0;
    if (keep && up_fd >= 0) {
      up = Liveness::Link{up_fd, rank == leader ? 0 : leader};
    } else if (up_fd >= 0) {
      close(up_fd);
    }
    if (rank == leader && !keep) {
      for (const Liveness::Link& link : down) close(link.fd);
      down.clear();
    }
    MPI_Comm_free(&host_comm);
  }
  std::vector<int> leader_of;
  if (rank == 0) leader_of = tree.leader;
  liveness->Adopt(rank, up, down, rank == 0 ? hosts : std::vector<std::string>{root_host},
                  std::move(leader_of), bound);
  return Status::OK();
}

}  // namespace hvdkeras

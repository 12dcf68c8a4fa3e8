#include "core/liveness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

namespace hvdkeras {

namespace {

constexpr char kBeat = 'h';
constexpr char kGoodbye = 'b';
constexpr double kConnectSeconds = 3.0;  // per address rank 0 offers
constexpr double kAcceptSeconds = 15.0;  // rank 0 waits this long for the hellos
constexpr int kOfferBytes = 1024;        // "port address address ..."
constexpr int kHostBytes = 256;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Millis(double seconds) { return static_cast<int>(std::max(0.0, seconds) * 1000.0); }

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// This host's IPv4 addresses: those on HVDKERAS_NETWORK_INTERFACES (the
// interfaces MPI was told to use) first, loopback last.
std::vector<std::string> OwnAddresses() {
  std::set<std::string> wanted;
  if (const char* names = std::getenv("HVDKERAS_NETWORK_INTERFACES")) {
    std::stringstream in(names);
    for (std::string name; std::getline(in, name, ',');) wanted.insert(name);
  }
  std::vector<std::string> preferred, others, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* item = list; item; item = item->ifa_next) {
      if (!item->ifa_addr || item->ifa_addr->sa_family != AF_INET ||
          !(item->ifa_flags & IFF_UP)) {
        continue;
      }
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(item->ifa_addr)->sin_addr, text,
                sizeof(text));
      if (item->ifa_flags & IFF_LOOPBACK) {
        loopback.push_back(text);
      } else {
        (wanted.count(item->ifa_name) ? preferred : others).push_back(text);
      }
    }
    freeifaddrs(list);
  }
  preferred.insert(preferred.end(), others.begin(), others.end());
  preferred.insert(preferred.end(), loopback.begin(), loopback.end());
  return preferred;
}

bool Wait(int fd, short events, double seconds) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, Millis(seconds)) == 1 && (p.revents & events);
}

// A connected socket to address:port, or -1 within `seconds`.
int ConnectWithin(const std::string& address, int port, double seconds) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &to.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  SetNonBlocking(fd);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  int error = 0;
  socklen_t length = sizeof(error);
  if (!Wait(fd, POLLOUT, seconds) ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Moves `size` bytes through a non-blocking socket within `seconds`.
bool Transfer(int fd, char* data, size_t size, double seconds, bool sending) {
  const double deadline = Now() + seconds;
  size_t done = 0;
  while (done < size) {
    if (!Wait(fd, sending ? POLLOUT : POLLIN, deadline - Now())) return false;
    const ssize_t n = sending ? send(fd, data + done, size - done, MSG_NOSIGNAL)
                              : recv(fd, data + done, size - done, 0);
    if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) return false;
    if (n > 0) done += static_cast<size_t>(n);
  }
  return true;
}

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

}  // namespace

void Liveness::Start(MPI_Comm comm, double bound_seconds) {
  Stop();
  int size = 1;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size);
  double bound = bound_seconds > 0 ? bound_seconds : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &bound, 1, MPI_DOUBLE, MPI_MIN, comm);
  if (bound <= 0 || size == 1) return;

  char name[kHostBytes] = {};
  gethostname(name, kHostBytes - 1);
  std::vector<char> names(static_cast<size_t>(size) * kHostBytes);
  MPI_Allgather(name, kHostBytes, MPI_CHAR, names.data(), kHostBytes, MPI_CHAR, comm);
  std::vector<std::string> hosts;
  for (int r = 0; r < size; ++r) hosts.emplace_back(names.data() + r * kHostBytes);
  std::vector<int> watched;
  for (int r = 1; r < size; ++r) {
    if (hosts[r] != hosts[0]) watched.push_back(r);
  }
  if (watched.empty()) return;  // one host: every rank knows it, nothing more is collective

  // Rank 0 listens on every address and offers them all; the others take the
  // first that answers.
  int listener = -1;
  std::vector<char> offer(kOfferBytes, '\0');
  if (rank_ == 0) {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t length = sizeof(any);
    if (listener >= 0 && bind(listener, reinterpret_cast<sockaddr*>(&any), sizeof(any)) == 0 &&
        listen(listener, size) == 0 &&
        getsockname(listener, reinterpret_cast<sockaddr*>(&any), &length) == 0) {
      std::string text = std::to_string(ntohs(any.sin_port));
      for (const std::string& address : OwnAddresses()) {
        if (text.size() + address.size() + 1 < kOfferBytes) text += " " + address;
      }
      std::memcpy(offer.data(), text.data(), text.size());
    }
  }
  MPI_Bcast(offer.data(), kOfferBytes, MPI_CHAR, 0, comm);
  std::istringstream parsed(std::string(offer.data()));
  int port = 0;
  parsed >> port;
  std::vector<std::string> addresses;
  for (std::string a; parsed >> a;) addresses.push_back(a);

  std::vector<Peer> peers;
  int fd = -1;
  if (rank_ != 0 && hosts[rank_] != hosts[0] && port > 0) {
    for (const std::string& address : addresses) {
      fd = ConnectWithin(address, port, kConnectSeconds);
      int32_t hello = rank_;
      if (fd >= 0 && Transfer(fd, reinterpret_cast<char*>(&hello), sizeof(hello),
                              kConnectSeconds, true)) {
        break;
      }
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  int connected = fd >= 0 ? 1 : 0;
  std::vector<int> accepted(static_cast<size_t>(size), 0);
  MPI_Gather(&connected, 1, MPI_INT, accepted.data(), 1, MPI_INT, 0, comm);
  if (rank_ == 0) {
    std::set<int> expected;
    for (int r : watched) {
      if (accepted[r]) expected.insert(r);
      accepted[r] = 0;
    }
    const double deadline = Now() + kAcceptSeconds;
    while (!expected.empty() && Now() < deadline) {
      if (!Wait(listener, POLLIN, 0.1)) continue;
      const int peer = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      int32_t hello = -1;
      if (peer < 0) continue;
      if (!Transfer(peer, reinterpret_cast<char*>(&hello), sizeof(hello), kConnectSeconds,
                    false) || !expected.erase(hello)) {
        close(peer);
        continue;
      }
      accepted[hello] = 1;
      peers.push_back(Peer{peer, hello, Now()});
    }
    if (listener >= 0) close(listener);
    std::vector<int> missing;
    for (int r : watched) {
      if (!accepted[r]) missing.push_back(r);
    }
    if (!missing.empty()) {
      std::fprintf(stderr,
                   "hvdkeras: warning: rank(s) %s could not connect to rank 0's host (%s, "
                   "offered: %s) for host liveness, so a lost host among theirs is found only "
                   "by HVDKERAS_STALL_SHUTDOWN_SECONDS (see Note [host liveness]).\n",
                   JoinRanks(missing).c_str(), hosts[0].c_str(), offer.data());
    }
  }
  // Rank 0 says whom it took, so that no rank waits for beats that never come.
  MPI_Bcast(accepted.data(), size, MPI_INT, 0, comm);
  if (rank_ != 0 && fd >= 0) {
    if (accepted[rank_]) {
      SetNonBlocking(fd);
      peers.push_back(Peer{fd, 0, Now()});
    } else {
      close(fd);
    }
  }
  for (Peer& peer : peers) {
    int on = 1;
    setsockopt(peer.fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
  }
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  hosts_ = hosts;
  bound_seconds_ = bound;
  interval_seconds_ = BeatInterval(bound);
  last_beat_ = 0.0;
}

void Liveness::Close(Peer* peer, bool gone) {
  if (peer->fd >= 0) close(peer->fd);
  peer->fd = -1;
  if (gone) peer->watched = false;
}

void Liveness::Beat(double now) {
  last_beat_ = now;
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    if (send(peer.fd, &kBeat, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EWOULDBLOCK && errno != EINTR) {
      // Reset or broken pipe: the peer's kernel answered for a process that
      // ended. Anything else (a timeout, an unreachable host) keeps it watched.
      Close(&peer, errno == ECONNRESET || errno == EPIPE);
    }
  }
}

void Liveness::Read(double now) {
  char buffer[256];
  for (Peer& peer : peers_) {
    while (peer.fd >= 0) {
      const ssize_t n = recv(peer.fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n > 0) {
        peer.last_heard = now;
        if (std::memchr(buffer, kGoodbye, static_cast<size_t>(n))) Close(&peer, true);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
      Close(&peer, n == 0 || errno == ECONNRESET);  // closed: the process ended
    }
  }
}

Liveness::Verdict Liveness::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  Verdict verdict;
  if (bound_seconds_ <= 0 || peers_.empty()) return verdict;
  const double now = Now();
  if (now - last_beat_ >= interval_seconds_) Beat(now);
  Read(now);
  if (rank_ != 0) {
    const Peer& root = peers_.front();
    if (root.watched && now - root.last_heard > bound_seconds_) {
      verdict.cut_off = true;
      verdict.silent_seconds = now - root.last_heard;
    }
    return verdict;
  }
  std::map<int, double> heard;
  for (const Peer& peer : peers_) {
    if (peer.watched) heard[peer.rank] = peer.last_heard;
  }
  LostHosts lost = FindLostHosts(hosts_, heard, now, bound_seconds_);
  verdict.lost_hosts = std::move(lost.hosts);
  verdict.lost_ranks = std::move(lost.ranks);
  verdict.silent_seconds = lost.silent_seconds;
  return verdict;
}

double Liveness::SilentFor(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  const double now = Now();
  for (const Peer& peer : peers_) {
    if (peer.rank != rank || !peer.watched) continue;
    const double silent = now - peer.last_heard;
    return silent > 1.5 * interval_seconds_ ? silent : 0.0;
  }
  return 0.0;
}

std::string Liveness::HostOf(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank >= 0 && rank < static_cast<int>(hosts_.size()) ? hosts_[rank] : "?";
}

double Liveness::bound_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bound_seconds_;
}

double Liveness::BeatSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return interval_seconds_;
}

void Liveness::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Peer& peer : peers_) {
    if (peer.fd < 0) continue;
    send(peer.fd, &kGoodbye, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    Close(&peer, true);
  }
  peers_.clear();
  bound_seconds_ = 0.0;
}

}  // namespace hvdkeras

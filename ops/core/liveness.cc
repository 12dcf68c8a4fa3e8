#include "core/liveness.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace hvdkeras {

namespace {

constexpr char kBeat = 'h';
constexpr char kGoodbye = 'b';

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Liveness::Adopt(int rank, Link up, const std::vector<Link>& down,
                     std::vector<std::string> hosts, std::vector<int> leader_of,
                     double bound_seconds) {
  Stop();
  std::lock_guard<std::mutex> lock(mu_);
  const double now = Now();
  rank_ = rank;
  up_ = Peer{up.fd, up.rank, now, up.fd >= 0};
  down_.clear();
  down_index_.clear();
  for (const Link& link : down) {
    down_index_[link.rank] = down_.size();
    down_.push_back(Peer{link.fd, link.rank, now, true});
  }
  hosts_ = std::move(hosts);
  leader_of_ = std::move(leader_of);
  const bool any = up.fd >= 0 || !down.empty();
  bound_seconds_ = any ? bound_seconds : 0.0;
  interval_seconds_ = BeatInterval(bound_seconds);
  last_beat_ = 0.0;
}

void Liveness::Close(Peer* peer, bool gone) {
  if (peer->fd >= 0) close(peer->fd);
  peer->fd = -1;
  if (gone) peer->watched = false;
}

void Liveness::Beat(double now) {
  last_beat_ = now;
  auto send_beat = [this](Peer* peer) {
    if (peer->fd < 0) return;
    if (send(peer->fd, &kBeat, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        errno != EWOULDBLOCK && errno != EINTR) {
      // Reset or broken pipe: the peer's kernel answered for a process that
      // ended. Anything else (a timeout, an unreachable host) keeps it watched.
      Close(peer, errno == ECONNRESET || errno == EPIPE);
    }
  };
  send_beat(&up_);
  // Rank 0 beats its leaders; a leader's members hear rank 0 through the
  // relay in Poll, not from the leader's own clock.
  if (rank_ == 0) {
    for (Peer& peer : down_) send_beat(&peer);
  }
}

bool Liveness::Read(Peer* peer, double now) {
  char buffer[256];
  bool heard = false;
  while (peer->fd >= 0) {
    const ssize_t n = recv(peer->fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) {
      peer->last_heard = now;
      heard = true;
      if (std::memchr(buffer, kGoodbye, static_cast<size_t>(n))) Close(peer, true);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    Close(peer, n == 0 || errno == ECONNRESET);  // closed: the process ended
  }
  return heard;
}

void Liveness::SayGoodbye() {
  for (Peer& peer : down_) {
    if (peer.fd < 0) continue;
    send(peer.fd, &kGoodbye, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    Close(&peer, true);
  }
}

Liveness::Verdict Liveness::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  Verdict verdict;
  if (bound_seconds_ <= 0) return verdict;
  const double now = Now();
  if (now - last_beat_ >= interval_seconds_) Beat(now);
  const bool was_watched = up_.watched;
  const bool from_root = Read(&up_, now);
  for (Peer& peer : down_) Read(&peer, now);
  if (rank_ != 0) {
    if (!down_.empty()) {
      // A leader: Note [liveness tree].
      if (was_watched && !up_.watched) {
        SayGoodbye();
      } else if (from_root) {
        for (Peer& peer : down_) {
          if (peer.fd >= 0) send(peer.fd, &kBeat, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
      }
    }
    if (up_.watched && now - up_.last_heard > bound_seconds_) {
      verdict.cut_off = true;
      verdict.silent_seconds = now - up_.last_heard;
    }
    return verdict;
  }
  std::map<int, double> heard;
  for (const Peer& peer : down_) {
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
  const Peer* peer = nullptr;
  if (rank_ == 0) {
    if (rank >= 0 && rank < static_cast<int>(leader_of_.size())) {
      auto it = down_index_.find(leader_of_[rank]);
      if (it != down_index_.end()) peer = &down_[it->second];
    }
  } else if (rank == 0) {
    peer = &up_;
  }
  if (!peer || !peer->watched) return 0.0;
  const double silent = Now() - peer->last_heard;
  return silent > 1.5 * interval_seconds_ ? silent : 0.0;
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

int Liveness::sockets() const {
  std::lock_guard<std::mutex> lock(mu_);
  int open = up_.fd >= 0 ? 1 : 0;
  for (const Peer& peer : down_) open += peer.fd >= 0;
  return open;
}

void Liveness::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  SayGoodbye();
  if (up_.fd >= 0) {
    send(up_.fd, &kGoodbye, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    Close(&up_, true);
  }
  up_ = Peer();
  up_.watched = false;
  down_.clear();
  down_index_.clear();
  bound_seconds_ = 0.0;
}

}  // namespace hvdkeras

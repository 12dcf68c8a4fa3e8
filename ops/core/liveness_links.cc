#include "core/liveness_links.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "core/liveness_rules.h"

namespace hvdkeras {

namespace {

constexpr double kConnectSeconds = 3.0;  // per address offered

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Millis(double seconds) { return static_cast<int>(std::max(0.0, seconds) * 1000.0); }

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void NoDelay(int fd) {
  int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

bool Wait(int fd, short events, double seconds) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, Millis(seconds)) == 1 && (p.revents & events);
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

long OpenDescriptors() {
  long count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir)) ++count;
    closedir(dir);
  }
  return count;
}

}  // namespace

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

LivenessListener ListenForPeers(bool loopback_only, int backlog) {
  LivenessListener listener;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return listener;
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  socklen_t length = sizeof(any);
  if (bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)) != 0 ||
      listen(fd, std::max(backlog, 16)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&any), &length) != 0) {
    close(fd);
    return listener;
  }
  SetNonBlocking(fd);
  listener.fd = fd;
  listener.port = ntohs(any.sin_port);
  return listener;
}

int ConnectAndGreet(const std::vector<std::string>& addresses, int port, int rank) {
  if (port <= 0) return -1;
  for (const std::string& address : addresses) {
    const int fd = ConnectWithin(address, port, kConnectSeconds);
    int32_t hello = rank;
    if (fd >= 0 && Transfer(fd, reinterpret_cast<char*>(&hello), sizeof(hello),
                            kConnectSeconds, true)) {
      NoDelay(fd);
      return fd;
    }
    if (fd >= 0) close(fd);
  }
  return -1;
}

std::map<int, int> AcceptGreetings(LivenessListener* listener, std::set<int> expected,
                                   double seconds) {
  std::map<int, int> accepted;
  const double deadline = Now() + seconds;
  // The greetings are read together, so that one peer that connects and
  // says nothing costs its own bound, not everyone's.
  std::map<int, double> greeting;  // socket -> when it connected
  while (listener->fd >= 0 && !expected.empty() && Now() < deadline) {
    std::vector<pollfd> polled{{listener->fd, POLLIN, 0}};
    for (const auto& item : greeting) polled.push_back({item.first, POLLIN, 0});
    if (poll(polled.data(), polled.size(), 100) <= 0) continue;
    if (polled[0].revents & POLLIN) {
      for (int fd; (fd = accept4(listener->fd, nullptr, nullptr,
                                 SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;) {
        greeting[fd] = Now();
      }
    }
    for (size_t i = 1; i < polled.size(); ++i) {
      const int fd = polled[i].fd;
      const bool late = Now() - greeting[fd] > kConnectSeconds;
      if (!(polled[i].revents & (POLLIN | POLLHUP | POLLERR)) && !late) continue;
      int32_t hello = -1;
      greeting.erase(fd);
      // A greeting is 4 bytes sent at once: what arrived is all of it.
      if (late || recv(fd, &hello, sizeof(hello), MSG_WAITALL) != sizeof(hello) ||
          !expected.erase(hello)) {
        close(fd);
        continue;
      }
      NoDelay(fd);
      accepted[hello] = fd;
    }
  }
  for (const auto& item : greeting) close(item.first);
  if (listener->fd >= 0) close(listener->fd);
  listener->fd = -1;
  return accepted;
}

std::string EnsureDescriptors(long needed, const std::string& what) {
  rlimit limit{};
  if (needed <= 0 || getrlimit(RLIMIT_NOFILE, &limit) != 0) return "";
  const long soft = static_cast<long>(limit.rlim_cur);
  const long hard = limit.rlim_max == RLIM_INFINITY ? -1 : static_cast<long>(limit.rlim_max);
  const long open_now = OpenDescriptors();
  const long target = DescriptorLimitFor(open_now, needed, soft, hard);
  if (target == 0) return "";
  if (target > 0) {
    limit.rlim_cur = static_cast<rlim_t>(target);
    if (setrlimit(RLIMIT_NOFILE, &limit) == 0) return "";
  }
  std::ostringstream out;
  out << what << " needs " << needed << " more file descriptors (one connection per host, "
      << open_now << " open already), but the limit is " << soft << " and its hard limit "
      << (hard < 0 ? std::string("unlimited") : std::to_string(hard))
      << " does not allow raising it far enough. Raise it before launching (`ulimit -n "
      << open_now + needed + std::max(256L, needed / 4)
      << "` in the job's shell, or LimitNOFILE / limits.conf for its service), or turn host "
         "liveness off with HVDKERAS_LIVENESS_SECONDS=0.";
  return out.str();
}

}  // namespace hvdkeras

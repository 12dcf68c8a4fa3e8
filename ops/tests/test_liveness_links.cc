// Host liveness at rank 0 with many hosts, on real sockets (core/liveness.cc,
// core/liveness_links.cc) and without MPI: a forked process stands in for
// the leaders of 1,500 other hosts (one greeting and one connection each, as
// liveness_start.cc makes them), while this process is rank 0 under a soft
// descriptor limit of 1,024.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/liveness.h"
#include "core/liveness_links.h"
#include "tests/harness.h"

namespace {

using hvdkeras::Liveness;

constexpr int kHosts = 1500;
constexpr int kSilentRank = 7;
constexpr double kBound = 2.0;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SetSoftLimit(rlim_t soft) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = soft;
  return setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

// The stand-in leaders: greet as ranks 1..kHosts, beat every 50 ms; after
// a second, rank kSilentRank falls silent (its socket stays open, as behind
// a cut link) and one byte on `told` says when.
[[noreturn]] void RunLeaders(int port, int told) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
  std::vector<int> fds;
  for (int r = 1; r <= kHosts; ++r) {
    fds.push_back(hvdkeras::ConnectAndGreet({"127.0.0.1"}, port, r));
  }
  const double start = Now();
  bool silenced = false;
  char sink[4096];
  for (;;) {
    for (int r = 1; r <= kHosts; ++r) {
      const int fd = fds[r - 1];
      if (fd < 0) continue;
      while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
      if (r == kSilentRank && silenced) continue;
      send(fd, "h", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (!silenced && Now() - start > 1.0) {
      silenced = true;
      if (write(told, "s", 1) != 1) _exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST(RankZeroWatchesFifteenHundredHostsUnderASoftLimitOf1024) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < 2 * kHosts) {
    std::printf("skipped: the hard descriptor limit (%lu) is below %d\n",
                static_cast<unsigned long>(limit.rlim_max), 2 * kHosts);
    return;
  }
  CHECK(SetSoftLimit(1024));
  CHECK_EQ(hvdkeras::EnsureDescriptors(kHosts, "rank 0"), std::string());
  getrlimit(RLIMIT_NOFILE, &limit);
  CHECK(limit.rlim_cur > static_cast<rlim_t>(kHosts));  // raised to what is needed

  hvdkeras::LivenessListener listener = hvdkeras::ListenForPeers(false, kHosts);
  CHECK(listener.fd >= 0);
  int told[2];
  CHECK_EQ(pipe(told), 0);
  const pid_t child = fork();
  if (child == 0) RunLeaders(listener.port, told[1]);
  close(told[1]);

  std::set<int> expected;
  for (int r = 1; r <= kHosts; ++r) expected.insert(r);
  const auto accepted = hvdkeras::AcceptGreetings(&listener, expected, 60.0);
  CHECK_EQ(accepted.size(), static_cast<size_t>(kHosts));
  std::vector<Liveness::Link> down;
  std::vector<std::string> hosts{"h0"};
  std::vector<int> leader_of{0};
  for (int r = 1; r <= kHosts; ++r) {
    hosts.push_back("h" + std::to_string(r));
    leader_of.push_back(r);
  }
  for (const auto& [rank, fd] : accepted) down.push_back(Liveness::Link{fd, rank});
  Liveness liveness;
  liveness.Adopt(0, Liveness::Link{}, down, hosts, leader_of, kBound);
  CHECK_EQ(liveness.sockets(), kHosts);

  char byte = 0;
  CHECK_EQ(read(told[0], &byte, 1), 1);  // rank kSilentRank stops beating now
  const double silenced = Now();
  Liveness::Verdict verdict;
  while (Now() - silenced < 4 * kBound) {
    verdict = liveness.Poll();
    if (!verdict.lost_hosts.empty()) break;
    CHECK(liveness.SilentFor(kSilentRank + 1) == 0.0);  // the others keep beating
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double took = Now() - silenced;
  CHECK(verdict.lost_hosts == (std::vector<std::string>{"h" + std::to_string(kSilentRank)}));
  CHECK(verdict.lost_ranks == (std::vector<int>{kSilentRank}));
  CHECK(took >= kBound - 0.2);
  CHECK(took < kBound + 1.0);
  std::printf("1,500 hosts watched from one rank 0: the silent host named %.2f s after its "
              "last beat (bound %.1f s)\n", took, kBound);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(told[0]);
  liveness.Stop();
}

TEST(AHardLimitTooLowIsRefusedNamingTheLimitAndUlimit) {
  // In a child: lowering the hard limit cannot be undone.
  int out[2];
  CHECK_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    rlimit limit{1024, 1100};
    setrlimit(RLIMIT_NOFILE, &limit);
    const std::string why = hvdkeras::EnsureDescriptors(kHosts, "Host liveness on rank 0");
    if (write(out[1], why.data(), why.size()) < 0) _exit(2);
    _exit(0);
  }
  close(out[1]);
  std::string why;
  char buffer[1024];
  for (ssize_t n; (n = read(out[0], buffer, sizeof(buffer))) > 0;) why.append(buffer, n);
  waitpid(child, nullptr, 0);
  close(out[0]);
  CHECK(why.find("Host liveness on rank 0 needs 1500 more file descriptors") != std::string::npos);
  CHECK(why.find("the limit is 1024") != std::string::npos);
  CHECK(why.find("hard limit 1100") != std::string::npos);
  CHECK(why.find("ulimit -n") != std::string::npos);
  CHECK(why.find("HVDKERAS_LIVENESS_SECONDS=0") != std::string::npos);
}

}  // namespace

// Unit tests of the control plane's stand-in (core/virtual_ranks.cc): the
// real Negotiator at every virtual rank over the in-memory transport. At
// 1,000 virtual ranks every rank must run the same names in the same order,
// allgathers must carry each rank's own rows, and steps after the first
// must stay on the cache's one-allreduce path.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/virtual_ranks.h"
#include "tests/harness.h"

namespace {

using hvdkeras::RunVirtualJob;
using hvdkeras::VirtualCycle;
using hvdkeras::VirtualJob;
using hvdkeras::VirtualJobReport;

std::vector<std::string> Step(const VirtualJobReport& report, int tensors, int step) {
  return std::vector<std::string>(report.order.begin() + step * tensors,
                                  report.order.begin() + (step + 1) * tensors);
}

TEST(ThousandVirtualRanksAgreeAndStayCachedAfterTheFirstStep) {
  VirtualJob job;
  job.ranks = 1000;
  job.tensors = 40;
  job.allgathers = 4;
  job.stragglers = 3;
  const VirtualJobReport report = RunVirtualJob(job);
  CHECK_EQ(report.error, std::string(""));
  CHECK(report.agreed);
  CHECK(report.exact);
  CHECK_EQ(report.order.size(), size_t{3 * 40});
  int first_step_negotiated = 0;
  for (const VirtualCycle& c : report.cycles) {
    if (c.step == 0) {
      first_step_negotiated += static_cast<int>(c.negotiated);
      continue;
    }
    CHECK_EQ(c.negotiated, int64_t{0});  // cached from the second step on
    CHECK_EQ(c.exchanges.gathers, int64_t{0});
    CHECK_EQ(c.exchanges.allreduces, int64_t{1});
  }
  CHECK_EQ(first_step_negotiated, 40);
  // With stragglers every name waits for them, so each step takes two cycles.
  CHECK_EQ(report.cycles.size(), size_t{3 * 2});
  CHECK(report.rank0_table_peak_bytes > 0);
  std::printf("  1000 virtual ranks: first step %.4f s of rank 0's CPU, %lld bytes at rank 0\n",
              report.cycles[0].rank0_cpu_s + report.cycles[1].rank0_cpu_s,
              static_cast<long long>(report.cycles[0].exchanges.gather_bytes_at_root +
                                     report.cycles[1].exchanges.gather_bytes_at_root));
}

TEST(TheOrderDoesNotDependOnTheRankCount) {
  // Ranks that submit in the same order get the same agreed order at 4 and
  // at 600 ranks, every step (the order the requests arrived at rank 0).
  VirtualJob job;
  job.tensors = 30;
  job.allgathers = 3;
  job.shuffled = false;
  job.ranks = 4;
  const VirtualJobReport small = RunVirtualJob(job);
  job.ranks = 600;
  const VirtualJobReport large = RunVirtualJob(job);
  CHECK(small.agreed && large.agreed && small.exact && large.exact);
  CHECK_EQ(large.order, small.order);
  CHECK_EQ(Step(small, 30, 0), Step(small, 30, 2));
}

TEST(AColdRankZeroRunsTheSameJob) {
  // Rank 0 writing its eviction buffer before each cycle (Note [a cold rank
  // 0]) changes what its cycles cost, nothing of what they agree.
  VirtualJob job;
  job.ranks = 16;
  job.tensors = 30;
  job.stragglers = 2;
  job.shuffled = false;
  const VirtualJobReport warm = RunVirtualJob(job);
  job.rank0_evict_bytes = 8 << 20;
  const VirtualJobReport cold = RunVirtualJob(job);
  CHECK(warm.agreed && cold.agreed && warm.exact && cold.exact);
  CHECK_EQ(cold.order, warm.order);
  CHECK_EQ(cold.cycles.size(), warm.cycles.size());
  for (size_t i = 0; i < cold.cycles.size() && i < warm.cycles.size(); ++i) {
    CHECK_EQ(cold.cycles[i].cached, warm.cycles[i].cached);
    CHECK_EQ(cold.cycles[i].negotiated, warm.cycles[i].negotiated);
    CHECK(cold.cycles[i].rank0_cpu_s > 0.0);
  }
}

TEST(AFullCacheFallsBackToTheCoordinatorButStaysExact) {
  VirtualJob job;
  job.ranks = 64;
  job.tensors = 50;
  job.cache_capacity = 20;
  const VirtualJobReport report = RunVirtualJob(job);
  CHECK(report.agreed && report.exact);
  CHECK_EQ(report.error, std::string(""));
  int64_t negotiated_later = 0;
  for (const VirtualCycle& c : report.cycles) {
    if (c.step > 0) negotiated_later += c.negotiated;
  }
  CHECK(negotiated_later >= 2 * 30);  // what did not fit goes through rank 0 every step
}

TEST(OpsWaitingForTheirBitWhileTheCacheEvictsStayExact) {
  // Note [classified once]: an op keeps its slot across cycles only while
  // the slot holds its entry. Here ops wait for stragglers over several
  // cycles while a cache too small for the step evicts and reuses slots
  // under them: each must go to the coordinator instead of announcing a
  // slot that now means another tensor, and every step must still run each
  // name once, in the same order on every rank.
  VirtualJob job;
  job.ranks = 16;
  job.tensors = 60;
  job.allgathers = 6;
  job.steps = 5;
  job.cache_capacity = 25;
  job.arrival_cycles = 4;
  job.stragglers = 5;
  const VirtualJobReport report = RunVirtualJob(job);
  CHECK_EQ(report.error, std::string(""));
  CHECK(report.agreed && report.exact);
  CHECK_EQ(report.order.size(), size_t{5 * 60});
  int64_t cached = 0, negotiated = 0;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::string> names = Step(report, 60, step);
    std::sort(names.begin(), names.end());
    CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
  }
  for (const VirtualCycle& c : report.cycles) {
    if (c.step == 0) continue;
    cached += c.cached;
    negotiated += c.negotiated;
  }
  CHECK(cached > 0);       // some still hit
  CHECK(negotiated > 0);   // and the evicted went through rank 0
  CHECK_EQ(cached + negotiated, int64_t{4 * 60});
}

TEST(TensorsHandedOverInSeveralCyclesAreCountedOnceAndTimed) {
  // As a backward pass spreads its gradients over the engine's cycles: the
  // first step's requests reach rank 0 once each however they are spread,
  // a steady step takes as many cycles as the tensors arrive in, every
  // tensor is still answered from the cache, and rank 0's own CPU is
  // counted in every cycle.
  VirtualJob job;
  job.ranks = 64;
  job.tensors = 30;
  job.shuffled = false;
  job.arrival_cycles = 3;
  const VirtualJobReport spread = RunVirtualJob(job);
  job.arrival_cycles = 1;
  const VirtualJobReport whole = RunVirtualJob(job);
  CHECK(spread.agreed && spread.exact && whole.agreed && whole.exact);
  CHECK_EQ(Step(spread, 30, 0), Step(whole, 30, 0));
  // The bytes that reached rank 0 in the first step.
  auto first_step_bytes = [](const VirtualJobReport& report) {
    int64_t bytes = 0;
    for (const VirtualCycle& c : report.cycles) {
      if (c.step == 0) bytes += c.exchanges.gather_bytes_at_root;
    }
    return bytes;
  };
  const int64_t spread_bytes = first_step_bytes(spread), whole_bytes = first_step_bytes(whole);
  int steady_cycles = 0;
  for (const VirtualCycle& c : spread.cycles) {
    if (c.step == 1) {
      ++steady_cycles;
      CHECK_EQ(c.cached, int64_t{10});
      CHECK_EQ(c.negotiated, int64_t{0});
    }
    CHECK(c.rank0_cpu_s > 0.0);
  }
  CHECK_EQ(steady_cycles, 3);
  CHECK_EQ(spread_bytes, whole_bytes);
  CHECK_EQ(whole_bytes, int64_t{63 * 30 * 20});  // a 20-byte digest per request
}

TEST(BadJobsAreRefusedWithTheirLimits) {
  VirtualJob job;
  job.ranks = 2;
  job.stragglers = 2;
  const VirtualJobReport report = RunVirtualJob(job);
  CHECK(!report.agreed);
  CHECK(report.error.find("stragglers < ranks") != std::string::npos);
}

}  // namespace

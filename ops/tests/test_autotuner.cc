// Unit tests of the autotuner's pure logic (ops/core/autotuner.cc): the order
// of trials, fixed parameters, the choice of the best score, when it is done,
// and the trial results it reports. Built with autotuner.cc only, without MPI
// or TensorFlow (tests/test_core_units.py compiles and runs it).
//
// Time is simulated: every RecordCycle call advances a fake clock by a fixed
// step and moves bytes = score(params) * step, so each window's measured
// throughput is exactly the score the test assigned to the current params.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/autotuner.h"
#include "tests/harness.h"

namespace {

using hvdkeras::Autotuner;
using hvdkeras::CycleTimeCandidates;
using hvdkeras::ThresholdCandidates;
using hvdkeras::TrialResult;
using hvdkeras::TuningParams;
using Clock = Autotuner::Clock;
using Score = std::function<double(const TuningParams&)>;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr double kStepSeconds = 0.1;  // per simulated cycle: 5 cycles = one 0.5 s window

struct Run {
  std::vector<TrialResult> trials;         // in order, as reported
  std::vector<TuningParams> params_used;   // params in effect at each trial start
  int changes = 0;                         // RecordCycle returned true
  int cycles = 0;
};

// Drives `tuner` with simulated cycles until it is done (or `max_cycles`).
Run Drive(Autotuner& tuner, const Score& score, int max_cycles = 100000) {
  Run run;
  Clock::time_point now{};  // the epoch: any fixed origin will do
  TuningParams before = tuner.current();
  run.params_used.push_back(before);
  while (!tuner.done() && run.cycles < max_cycles) {
    now += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(kStepSeconds));
    const int64_t bytes = static_cast<int64_t>(std::llround(score(tuner.current()) * kStepSeconds));
    const bool changed = tuner.RecordCycle(bytes, now);
    ++run.cycles;
    CHECK_EQ(changed, !(tuner.current() == before));
    if (changed) {
      ++run.changes;
      before = tuner.current();
      if (!tuner.done()) run.params_used.push_back(before);
    }
    for (const TrialResult& t : tuner.TakeFinishedTrials()) run.trials.push_back(t);
  }
  return run;
}

// A score peaking at 8 MiB and 5 ms (multiples of 10 B/s, so that bytes per
// 0.1 s cycle are whole numbers and measured scores are exact).
double PeakScore(const TuningParams& p) {
  double s = 1000.0 * 1000.0;
  if (p.fusion_threshold == 8 * kMiB) s += 500000.0;
  if (p.cycle_time_ms == 5.0) s += 250000.0;
  return s + 10.0 * static_cast<double>(p.fusion_threshold % 7);  // small tie-breaks
}

TEST(Grids) {
  const std::vector<int64_t> thresholds = ThresholdCandidates();
  const std::vector<int64_t> want_t = {0, kMiB, 2 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB,
                                       32 * kMiB, 64 * kMiB, 128 * kMiB};
  CHECK(thresholds == want_t);
  const std::vector<double> want_c = {0.25, 0.5, 1.0, 2.0, 5.0, 10.0};
  CHECK(CycleTimeCandidates() == want_c);
}

TEST(ThresholdsFirstThenCycleTimesAtTheBest) {
  const TuningParams start{64 * kMiB, 1.0};
  Autotuner tuner(start, false, false);
  CHECK(!tuner.done());
  // The first trial is in effect at once (the engine sees it differs from start).
  CHECK(tuner.current() == (TuningParams{0, 1.0}));
  Run run = Drive(tuner, PeakScore);
  CHECK(tuner.done());
  const size_t nt = ThresholdCandidates().size();
  // The starting cycle time (1.0) is not tried again in the cycle-time phase.
  CHECK_EQ(run.trials.size(), nt + CycleTimeCandidates().size() - 1);
  for (size_t i = 0; i < run.trials.size(); ++i) {
    const TrialResult& t = run.trials[i];
    CHECK_EQ(t.trial, static_cast<int>(i) + 1);
    CHECK(t.params == run.params_used[i]);
    if (i < nt) {
      CHECK_EQ(t.params.fusion_threshold, ThresholdCandidates()[i]);
      CHECK_EQ(t.params.cycle_time_ms, 1.0);
    } else {
      CHECK_EQ(t.params.fusion_threshold, 8 * kMiB);  // the best threshold
      CHECK(t.params.cycle_time_ms != 1.0);
    }
    // Scores are the windows' throughput: exactly the simulated score.
    CHECK(std::fabs(t.score - PeakScore(t.params)) <= 1e-6 * PeakScore(t.params));
  }
  std::vector<double> cycles;
  for (size_t i = nt; i < run.trials.size(); ++i) cycles.push_back(run.trials[i].params.cycle_time_ms);
  CHECK((cycles == std::vector<double>{0.25, 0.5, 2.0, 5.0, 10.0}));
  // The best pair wins, and stays.
  CHECK(tuner.current() == (TuningParams{8 * kMiB, 5.0}));
  const auto after = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  CHECK(!tuner.RecordCycle(123456789, after));
  CHECK(tuner.current() == (TuningParams{8 * kMiB, 5.0}));
  CHECK(tuner.TakeFinishedTrials().empty());
  // The last change is the switch to the winner.
  CHECK_EQ(run.changes, static_cast<int>(run.trials.size()));
}

TEST(BestSoFarFlags) {
  // Scores rise, fall, then rise again over the threshold grid.
  auto score = [](const TuningParams& p) {
    static const std::vector<double> by_index = {10, 30, 20, 40, 40, 5, 50, 1, 2};
    const std::vector<int64_t> grid = ThresholdCandidates();
    for (size_t i = 0; i < grid.size(); ++i) {
      if (grid[i] == p.fusion_threshold) return by_index[i] * 1000.0;
    }
    return 0.0;
  };
  Autotuner tuner({64 * kMiB, 2.0}, false, /*cycle_time_fixed=*/true);
  Run run = Drive(tuner, score);
  CHECK(tuner.done());
  CHECK_EQ(run.trials.size(), ThresholdCandidates().size());  // no cycle-time phase
  const std::vector<bool> want = {true, true, false, true, false, false, true, false, false};
  for (size_t i = 0; i < run.trials.size() && i < want.size(); ++i) {
    CHECK_EQ(run.trials[i].best_so_far, want[i]);
    CHECK_EQ(run.trials[i].params.cycle_time_ms, 2.0);  // fixed
  }
  // A tie (40 at index 3 and 4) keeps the first; the overall best is index 6.
  CHECK(tuner.current() == (TuningParams{ThresholdCandidates()[6], 2.0}));
}

TEST(FixedThresholdSearchesOnlyCycleTimes) {
  const TuningParams start{3 * kMiB + 17, 1.0};
  Autotuner tuner(start, /*threshold_fixed=*/true, false);
  // Every cycle-time candidate is tried (the start's included).
  CHECK(tuner.current() == (TuningParams{start.fusion_threshold, 0.25}));
  Run run = Drive(tuner, PeakScore);
  CHECK(tuner.done());
  CHECK_EQ(run.trials.size(), CycleTimeCandidates().size());
  for (size_t i = 0; i < run.trials.size(); ++i) {
    CHECK_EQ(run.trials[i].params.fusion_threshold, start.fusion_threshold);
    CHECK_EQ(run.trials[i].params.cycle_time_ms, CycleTimeCandidates()[i]);
  }
  CHECK(tuner.current() == (TuningParams{start.fusion_threshold, 5.0}));
}

TEST(BothFixedIsDoneAtOnce) {
  const TuningParams start{5 * kMiB, 3.0};
  Autotuner tuner(start, true, true);
  CHECK(tuner.done());
  CHECK(tuner.current() == start);
  CHECK(!tuner.RecordCycle(1 << 20, Clock::time_point{} + std::chrono::seconds(5)));
  CHECK(tuner.TakeFinishedTrials().empty());
  CHECK(tuner.current() == start);
}

TEST(StartCycleTimeOffTheGrid) {
  // 3 ms is not a candidate, so the cycle-time phase tries all six.
  Autotuner tuner({64 * kMiB, 3.0}, false, false);
  Run run = Drive(tuner, PeakScore);
  CHECK_EQ(run.trials.size(), ThresholdCandidates().size() + CycleTimeCandidates().size());
  for (size_t i = 0; i < ThresholdCandidates().size() && i < run.trials.size(); ++i) {
    CHECK_EQ(run.trials[i].params.cycle_time_ms, 3.0);
  }
  CHECK(tuner.current() == (TuningParams{8 * kMiB, 5.0}));
}

TEST(IdleCyclesAndShortWindowsDoNotCount) {
  Autotuner tuner({64 * kMiB, 1.0}, false, false, /*window_seconds=*/1.0, /*window_cycles=*/3,
                  /*windows_per_trial=*/2);
  Clock::time_point now{};
  // Many cycles without data: nothing is measured.
  for (int i = 0; i < 1000; ++i) {
    now += std::chrono::milliseconds(10);
    CHECK(!tuner.RecordCycle(0, now));
  }
  CHECK(tuner.TakeFinishedTrials().empty());
  CHECK(tuner.current() == (TuningParams{0, 1.0}));
  // With data: a window needs >= 3 data cycles AND >= 1 s; a trial is a
  // warm-up window plus 2 measured ones. The warm-up window began with the
  // first (idle) cycle, so it already has its second and closes after 3 data
  // cycles; each measured window then takes 10 cycles of 0.1 s.
  int cycles = 0;
  std::vector<TrialResult> done;
  while (done.empty() && cycles < 1000) {
    now += std::chrono::milliseconds(100);
    tuner.RecordCycle(1000, now);
    ++cycles;
    for (const TrialResult& t : tuner.TakeFinishedTrials()) done.push_back(t);
  }
  CHECK_EQ(done.size(), size_t{1});
  CHECK_EQ(cycles, 3 + 10 + 10);
  if (!done.empty()) {
    CHECK_EQ(done[0].trial, 1);
    CHECK(std::fabs(done[0].score - 10000.0) < 1e-6);  // 1000 bytes / 0.1 s
    CHECK(done[0].best_so_far);
  }
  CHECK(tuner.current() == (TuningParams{kMiB, 1.0}));
}

}  // namespace

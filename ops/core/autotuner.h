// Online tuning of the fusion threshold and the cycle time (rank 0 decides,
// the engine makes every rank apply the same values in the same cycle).
//
// Method: a coordinate search over fixed grids. Each trial runs a parameter
// pair for a few measurement windows and scores it by the median throughput
// (bytes moved by collectives per second of wall time); the threshold grid
// is searched first at the starting cycle time, then the cycle-time grid at
// the best threshold, and the best pair seen is kept. Parameters the user
// set explicitly are not searched. Pure logic with no MPI: unit-testable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdkeras {

struct TuningParams {
  int64_t fusion_threshold = 0;
  double cycle_time_ms = 0.0;
  bool operator==(const TuningParams& o) const {
    return fusion_threshold == o.fusion_threshold && cycle_time_ms == o.cycle_time_ms;
  }
};

struct TrialResult {
  int trial = 0;
  TuningParams params;
  double score = 0.0;  // bytes per second, median of the windows
  bool best_so_far = false;
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // `start` is what the engine runs with now; a `*_fixed` parameter keeps its
  // value. Each window lasts at least `window_seconds` and `window_cycles`
  // cycles that moved data; the first window of a trial is a warm-up.
  Autotuner(TuningParams start, bool threshold_fixed, bool cycle_time_fixed,
            double window_seconds = 0.25, int window_cycles = 5, int windows_per_trial = 4);

  // Records one cycle that moved `bytes`. Returns true when the parameters
  // to use changed (read them with current()).
  bool RecordCycle(int64_t bytes, Clock::time_point now);

  const TuningParams& current() const { return current_; }
  bool done() const { return done_; }
  // Trials finished since the last call (for the CSV log).
  std::vector<TrialResult> TakeFinishedTrials();

 private:
  void StartTrial(const TuningParams& params, Clock::time_point now);
  bool FinishTrial(Clock::time_point now);

  std::vector<TuningParams> plan_;  // trials still to run
  bool searching_cycle_time_ = false;
  bool threshold_fixed_, cycle_time_fixed_;
  double window_seconds_;
  int window_cycles_, windows_per_trial_;

  TuningParams current_;
  TuningParams best_;
  double best_score_ = -1.0;
  bool done_ = false;
  int trial_number_ = 0;

  // Current trial's measurement.
  bool started_ = false;
  Clock::time_point window_start_;
  int64_t window_bytes_ = 0;
  int window_data_cycles_ = 0;
  int windows_done_ = 0;
  std::vector<double> scores_;
  std::vector<TrialResult> finished_;
};

// The grids searched.
std::vector<int64_t> ThresholdCandidates();
std::vector<double> CycleTimeCandidates();

}  // namespace hvdkeras

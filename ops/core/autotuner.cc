#include "core/autotuner.h"

#include <algorithm>

namespace hvdkeras {

std::vector<int64_t> ThresholdCandidates() {
  std::vector<int64_t> out;
  for (int64_t mib : {0, 1, 2, 4, 8, 16, 32, 64, 128}) out.push_back(mib << 20);
  return out;
}

std::vector<double> CycleTimeCandidates() { return {0.25, 0.5, 1.0, 2.0, 5.0, 10.0}; }

Autotuner::Autotuner(TuningParams start, bool threshold_fixed, bool cycle_time_fixed,
                     double window_seconds, int window_cycles, int windows_per_trial)
    : threshold_fixed_(threshold_fixed),
      cycle_time_fixed_(cycle_time_fixed),
      window_seconds_(window_seconds),
      window_cycles_(window_cycles),
      windows_per_trial_(windows_per_trial),
      current_(start),
      best_(start) {
  if (!threshold_fixed_) {
    for (int64_t t : ThresholdCandidates()) plan_.push_back({t, start.cycle_time_ms});
  } else if (!cycle_time_fixed_) {
    searching_cycle_time_ = true;
    for (double c : CycleTimeCandidates()) plan_.push_back({start.fusion_threshold, c});
  }
  done_ = plan_.empty();
  if (!done_) {
    current_ = plan_.front();
    plan_.erase(plan_.begin());
  }
}

void Autotuner::StartTrial(const TuningParams& params, Clock::time_point now) {
  current_ = params;
  started_ = true;
  window_start_ = now;
  window_bytes_ = 0;
  window_data_cycles_ = 0;
  windows_done_ = 0;
  scores_.clear();
}

bool Autotuner::RecordCycle(int64_t bytes, Clock::time_point now) {
  if (done_) return false;
  if (!started_) StartTrial(current_, now);
  if (bytes <= 0) return false;
  window_bytes_ += bytes;
  ++window_data_cycles_;
  const double elapsed = std::chrono::duration<double>(now - window_start_).count();
  if (window_data_cycles_ < window_cycles_ || elapsed < window_seconds_) return false;
  if (windows_done_ > 0) scores_.push_back(window_bytes_ / elapsed);  // the first warms up
  ++windows_done_;
  window_start_ = now;
  window_bytes_ = 0;
  window_data_cycles_ = 0;
  if (windows_done_ <= windows_per_trial_) return false;
  return FinishTrial(now);
}

bool Autotuner::FinishTrial(Clock::time_point now) {
  std::sort(scores_.begin(), scores_.end());
  TrialResult result;
  result.trial = ++trial_number_;
  result.params = current_;
  result.score = scores_[scores_.size() / 2];
  if (result.score > best_score_) {
    best_score_ = result.score;
    best_ = current_;
    result.best_so_far = true;
  }
  finished_.push_back(result);

  if (plan_.empty() && !searching_cycle_time_ && !cycle_time_fixed_) {
    searching_cycle_time_ = true;
    for (double c : CycleTimeCandidates()) {
      if (c != best_.cycle_time_ms) plan_.push_back({best_.fusion_threshold, c});
    }
  }
  const TuningParams before = current_;
  if (plan_.empty()) {
    done_ = true;
    current_ = best_;
  } else {
    StartTrial(plan_.front(), now);
    plan_.erase(plan_.begin());
  }
  return !(current_ == before);
}

std::vector<TrialResult> Autotuner::TakeFinishedTrials() {
  std::vector<TrialResult> out;
  out.swap(finished_);
  return out;
}

}  // namespace hvdkeras

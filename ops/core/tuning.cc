#include "core/tuning.h"

#include <algorithm>

#include <chrono>
#include <cstdio>

namespace hvdkeras {

void Tuning::Start(int rank, const EngineConfig& config) {
  tuner_.reset();
  news_ = false;
  log_path_ = config.autotune_log;
  if (!config.autotune || rank != 0) return;
  const TuningParams start{config.fusion_threshold, config.cycle_time_ms};
  tuner_.reset(new Autotuner(start, config.fusion_threshold_fixed, config.cycle_time_fixed));
  news_ = !(tuner_->current() == start);
  if (log_path_.empty()) return;
  if (FILE* f = std::fopen(log_path_.c_str(), "w")) {
    std::fprintf(f, "trial,fusion_threshold_bytes,cycle_time_ms,score_bytes_per_second,"
                    "best_so_far,final\n");
    std::fclose(f);
  }
}

void Tuning::Agree(const MpiContext& mpi, EngineConfig* config) {
  struct {
    int64_t threshold;
    double cycle_time_ms;
  } values{config->fusion_threshold, config->cycle_time_ms};
  if (tuner_) values = {tuner_->current().fusion_threshold, tuner_->current().cycle_time_ms};
  MPI_Bcast(&values, sizeof(values), MPI_BYTE, 0, mpi.comm());
  config->fusion_threshold = values.threshold;
  config->cycle_time_ms = values.cycle_time_ms;
  news_ = false;
}

void Tuning::Record(int64_t bytes) { Record(bytes, std::chrono::steady_clock::now()); }

void Tuning::Record(int64_t bytes, std::chrono::steady_clock::time_point when) {
  const bool was_done = tuner_->done();
  last_ = std::max(last_, when);
  if (tuner_->RecordCycle(bytes, last_)) news_ = true;
  const std::vector<TrialResult> trials = tuner_->TakeFinishedTrials();
  if (trials.empty() || log_path_.empty()) return;
  FILE* f = std::fopen(log_path_.c_str(), "a");
  if (!f) return;
  for (const TrialResult& t : trials) {
    std::fprintf(f, "%d,%lld,%g,%.6g,%d,0\n", t.trial,
                 static_cast<long long>(t.params.fusion_threshold), t.params.cycle_time_ms,
                 t.score, t.best_so_far ? 1 : 0);
  }
  if (!was_done && tuner_->done()) {
    std::fprintf(f, "final,%lld,%g,,,1\n",
                 static_cast<long long>(tuner_->current().fusion_threshold),
                 tuner_->current().cycle_time_ms);
  }
  std::fclose(f);
}

}  // namespace hvdkeras

// The engine's rank-0 supervision: the stall inspector and the autotuner's
// hand-out of new parameters (applied by every rank in the same cycle).
#include <cstdio>
#include <sstream>

#include "core/engine.h"

namespace hvdkeras {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Engine::AgreeOnParams() {
  // Rank 0 hands out new tuning values; every rank applies them in this same
  // cycle, so fusion plans stay identical.
  struct {
    int64_t threshold;
    double cycle_time_ms;
  } values{config_.fusion_threshold, config_.cycle_time_ms};
  if (tuner_) values = {tuner_->current().fusion_threshold, tuner_->current().cycle_time_ms};
  MPI_Bcast(&values, sizeof(values), MPI_BYTE, 0, mpi_.comm());
  config_.fusion_threshold = values.threshold;
  config_.cycle_time_ms = values.cycle_time_ms;
  current_threshold_ = values.threshold;
  current_cycle_time_ms_ = values.cycle_time_ms;
  params_changed_ = false;
}

void Engine::Autotune(int64_t bytes) {
  const bool was_done = tuner_->done();
  if (tuner_->RecordCycle(bytes, Clock::now())) params_changed_ = true;
  const std::vector<TrialResult> trials = tuner_->TakeFinishedTrials();
  if (trials.empty() || config_.autotune_log.empty()) return;
  FILE* f = std::fopen(config_.autotune_log.c_str(), "a");
  if (!f) return;
  for (const TrialResult& t : trials) {
    std::fprintf(f, "%d,%lld,%g,%.6g,%d,0\n", t.trial,
                 static_cast<long long>(t.params.fusion_threshold), t.params.cycle_time_ms,
                 t.score, t.best_so_far ? 1 : 0);
  }
  if (!was_done && tuner_->done()) {
    std::fprintf(f, "final,%lld,%g,,,1\n", static_cast<long long>(tuner_->current().fusion_threshold),
                 tuner_->current().cycle_time_ms);
  }
  std::fclose(f);
}

void Engine::InspectStalls() {
  const auto now = Clock::now();
  if (now - last_stall_check_ < std::chrono::milliseconds(200)) return;
  last_stall_check_ = now;
  if (config_.stall_check_seconds > 0) {
    for (const Stall& stall : coordinator_->FindStalls(now, config_.stall_check_seconds)) {
      std::ostringstream missing, submitted;
      for (size_t i = 0; i < stall.missing.size(); ++i) missing << (i ? ", " : "") << stall.missing[i];
      for (size_t i = 0; i < stall.submitted.size(); ++i) {
        submitted << (i ? ", " : "") << stall.submitted[i];
      }
      std::fprintf(stderr,
                   "hvdkeras: WARNING: collective '%s' has waited %.1f s: rank(s) %s have not "
                   "submitted it (rank(s) %s have). One rank may be running different "
                   "collectives or fewer steps than the others.\n",
                   stall.name.c_str(), stall.seconds, missing.str().c_str(),
                   submitted.str().c_str());
    }
  }
  if (config_.stall_shutdown_seconds > 0) {
    coordinator_->FailStalled(now, config_.stall_shutdown_seconds);
  }
}

}  // namespace hvdkeras

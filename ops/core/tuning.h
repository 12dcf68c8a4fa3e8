// Online tuning as the engine runs it: rank 0's autotuner proposes new
// fusion threshold and cycle time values, and every rank switches to them in
// the same cycle (so fusion plans stay identical across ranks).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "core/autotuner.h"
#include "core/engine_settings.h"
#include "core/mpi_context.h"

namespace hvdkeras {

class Tuning {
 public:
  // Engine start: rank 0 creates the tuner when `config.autotune` is set and
  // starts the CSV log.
  void Start(int rank, const EngineConfig& config);
  // Rank 0 has values the other ranks do not have yet.
  bool has_news() const { return news_; }
  // Whether this rank measures cycles (rank 0 while autotuning).
  bool measuring() const { return tuner_ != nullptr; }
  // Collective, in the cycle the ranks agreed on: every rank takes rank 0's
  // values into *config.
  void Agree(const MpiContext& mpi, EngineConfig* config);
  // Rank 0: one cycle that moved `bytes` (logs finished trials), finished
  // now, or for GPU work at the time the device finished it (Note [device
  // time] in device.h; never earlier than a time recorded before).
  void Record(int64_t bytes);
  void Record(int64_t bytes, std::chrono::steady_clock::time_point when);

 private:
  std::unique_ptr<Autotuner> tuner_;
  std::string log_path_;
  bool news_ = false;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace hvdkeras

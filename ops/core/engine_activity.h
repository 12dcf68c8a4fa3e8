// What one engine's thread is inside right now, and since when: written by
// that thread at each step of its cycle, read by the watchdog (watchdog.h)
// from its own thread. See Note [bounded waits] in watchdog.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

namespace hvdkeras {

class EngineActivity {
 public:
  // The steps of a cycle where the engine thread waits on other ranks (or
  // on the framework's callbacks) without a bound of its own.
  enum class Phase : int { kIdle = 0, kNegotiating, kExecuting, kCompleting, kClosing };

  static const char* PhaseName(Phase phase) {
    switch (phase) {
      case Phase::kNegotiating: return "negotiating which collectives are ready";
      case Phase::kExecuting: return "executing";
      case Phase::kCompleting: return "handing results back to the framework";
      case Phase::kClosing: return "closing";
      default: return "idle";
    }
  }

  explicit EngineActivity(std::string label = "global set") : label_(std::move(label)) {}
  const std::string& label() const { return label_; }

  // Engine thread. `detail` (e.g. the collectives executing) is kept for
  // the watchdog's message; pass null to keep the previous one.
  void Enter(Phase phase, const std::string* detail = nullptr) {
    if (detail) {
      std::lock_guard<std::mutex> lock(mu_);
      detail_ = *detail;
    }
    since_ns_.store(NowNs(), std::memory_order_relaxed);
    phase_.store(static_cast<int>(phase), std::memory_order_release);
  }
  void Leave() { phase_.store(static_cast<int>(Phase::kIdle), std::memory_order_release); }

  // Says which collectives this rank has in flight, in words ("" when
  // none); set once, before the watchdog may ask. Any thread may call it.
  void SetWaitingSource(std::function<std::string()> source) { waiting_ = std::move(source); }

  // Any thread: the phase and for how many seconds it has lasted.
  Phase phase(double* seconds) const {
    const Phase p = static_cast<Phase>(phase_.load(std::memory_order_acquire));
    *seconds = (NowNs() - since_ns_.load(std::memory_order_relaxed)) * 1e-9;
    return p;
  }

  // Any thread: one line, e.g. "global set: executing 'a' and 1 more for
  // 3.2 s; in flight here: 2 collective(s) ('x', 'y')".
  std::string Describe() const {
    double seconds = 0.0;
    const Phase p = phase(&seconds);
    std::string text = label_ + ": ";
    std::lock_guard<std::mutex> lock(mu_);
    if (p == Phase::kIdle) {
      text += "engine cycling normally";
    } else {
      char took[32];
      std::snprintf(took, sizeof(took), "%.1f", seconds);
      text += std::string(PhaseName(p)) + (detail_.empty() || p != Phase::kExecuting
                                                ? std::string()
                                                : " " + detail_) +
              " for " + took + " s";
    }
    const std::string waiting = waiting_ ? waiting_() : std::string();
    text += waiting.empty() ? "; no collective in flight here" : "; in flight here: " + waiting;
    return text;
  }

 private:
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  const std::string label_;
  std::atomic<int> phase_{0};
  std::atomic<int64_t> since_ns_{0};
  mutable std::mutex mu_;
  std::string detail_;
  std::function<std::string()> waiting_;
};

}  // namespace hvdkeras

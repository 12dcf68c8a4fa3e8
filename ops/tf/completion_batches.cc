#include "tf/completion_batches.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/engine_api.h"

namespace hvdkeras {
namespace {

using Clock = std::chrono::steady_clock;
using Runner = std::function<void(std::function<void()>)>;

// A runner's done()s from one engine batch, run by whichever comes first:
// the task on the runner, or the engine when that task is late.
struct Batch {
  std::vector<std::function<void()>> dones;
  Clock::time_point handed_over;
  std::atomic<bool> claimed{false};
};

void RunOnce(Batch& batch) {
  if (batch.claimed.exchange(true)) return;
  for (auto& done : batch.dones) done();
}

// What this engine thread held back in its current batch, in finishing order.
thread_local std::vector<std::pair<Runner*, std::function<void()>>> held_back;

std::mutex outstanding_mu;
// Batches handed to runners, until claimed (never destroyed: see AllOutstanding).
std::vector<std::shared_ptr<Batch>>& AllOutstanding() {
  static auto* batches = new std::vector<std::shared_ptr<Batch>>();
  return *batches;
}

// A task that has not started this long after its hand-over is late: its
// runner's threads may all be held by whatever waits for it (an eager
// collective inside a py_function, say), so the engine runs it instead.
constexpr auto kLate = std::chrono::milliseconds(2);

// The batch ended: one task per runner calls that runner's done()s. A runner
// outlives its kernels, and none of these has finished yet.
void HandOver() {
  std::vector<std::pair<Runner*, std::function<void()>>> all;
  all.swap(held_back);
  const Clock::time_point now = Clock::now();
  while (!all.empty()) {
    Runner* runner = all.front().first;
    auto batch = std::make_shared<Batch>();
    batch->handed_over = now;
    std::vector<std::pair<Runner*, std::function<void()>>> rest;
    for (auto& entry : all) {
      if (entry.first == runner) {
        batch->dones.push_back(std::move(entry.second));
      } else {
        rest.push_back(std::move(entry));
      }
    }
    all.swap(rest);
    {
      std::lock_guard<std::mutex> lock(outstanding_mu);
      AllOutstanding().push_back(batch);
    }
    (*runner)([batch] { RunOnce(*batch); });
  }
}

// Every engine cycle: forget claimed batches, run late ones (all, when an
// engine stops).
void TakeBackLate(bool final) {
  std::vector<std::shared_ptr<Batch>> late;
  {
    std::lock_guard<std::mutex> lock(outstanding_mu);
    std::vector<std::shared_ptr<Batch>>& outstanding = AllOutstanding();
    if (outstanding.empty()) return;
    const Clock::time_point now = Clock::now();
    std::vector<std::shared_ptr<Batch>> kept;
    for (auto& batch : outstanding) {
      if (batch->claimed.load()) continue;
      if (final || now - batch->handed_over >= kLate) {
        late.push_back(std::move(batch));
      } else {
        kept.push_back(std::move(batch));
      }
    }
    outstanding.swap(kept);
  }
  for (auto& batch : late) RunOnce(*batch);
}

const bool registered = [] {
  CompletionHooks hooks;
  hooks.batch_end = &HandOver;
  hooks.cycle_start = &TakeBackLate;
  SetCompletionHooks(hooks);
  return true;
}();

}  // namespace

void FinishKernel(tensorflow::OpKernelContext* ctx, std::function<void()> done) {
  Runner* runner = ctx->runner();
  // An op run eagerly (no call frame) has a Python thread waiting for it.
  if (!registered || !InsideCompletionBatch() || ctx->call_frame() == nullptr ||
      runner == nullptr || !*runner) {
    done();
    return;
  }
  held_back.emplace_back(runner, std::move(done));
}

}  // namespace hvdkeras

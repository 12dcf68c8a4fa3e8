#include "core/completion_batch.h"

#include <atomic>

#include "core/engine_api.h"

namespace hvdkeras {
namespace {

std::atomic<void (*)()> batch_end_hook{nullptr};
std::atomic<void (*)(bool)> cycle_start_hook{nullptr};
thread_local int open_batches = 0;

}  // namespace

CompletionBatch::CompletionBatch() { ++open_batches; }

CompletionBatch::~CompletionBatch() {
  if (--open_batches > 0) return;
  void (*hook)() = batch_end_hook.load();
  if (hook != nullptr) hook();
}

void CompletionCycleStart(bool final) {
  void (*hook)(bool) = cycle_start_hook.load();
  if (hook != nullptr) hook(final);
}

void SetCompletionHooks(const CompletionHooks& hooks) {
  batch_end_hook.store(hooks.batch_end);
  cycle_start_hook.store(hooks.cycle_start);
}

bool InsideCompletionBatch() { return open_batches > 0; }

}  // namespace hvdkeras

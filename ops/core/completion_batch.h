// The span in which the engine's thread runs one cycle's done callbacks.
//
// Note [completion batches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The engine calls the done callbacks of the ops a cycle finished (or
// failed) back to back on its own thread, inside a CompletionBatch. When the
// batch ends, the engine calls the batch_end hook a binding registered with
// SetCompletionHooks (engine_api.h), on the same thread. A binding may
// therefore hold back work from its callbacks while InsideCompletionBatch()
// is true and hand it over once per cycle (Note [completions on the
// framework's pool] in tf/completion_batches.h). Whatever it hands over to
// threads of its own must not be able to wait forever: the cycle_start hook,
// called at the start of every engine cycle and once more when an engine
// stops, is where it takes back what those threads have not picked up.
// Engine::Finish and Engine::FailEverything are the only places that run
// callbacks; both open a batch.
#pragma once

namespace hvdkeras {

// Calls the registered cycle_start hook, if any.
void CompletionCycleStart(bool final);

class CompletionBatch {
 public:
  CompletionBatch();
  ~CompletionBatch();  // calls the registered hook
  CompletionBatch(const CompletionBatch&) = delete;
  CompletionBatch& operator=(const CompletionBatch&) = delete;
};

}  // namespace hvdkeras

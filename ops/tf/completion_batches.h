// How the TensorFlow kernels report that the engine finished them.
//
// Note [completions on the framework's pool]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The engine finishes a cycle's ops together, on its own thread. When an
// async kernel's done() runs on a thread that is not TensorFlow's, the
// executor hands each op's newly ready consumers to its inter-op pool as a
// task of their own, and each such task wakes a parked pool thread: 100
// separate allreduces returned from a tf.function cost ~92 context switches
// per step (measured, 2 ranks on 2 cores). The kernels therefore hold back
// their done() until the engine's batch of callbacks ends (Note [completion
// batches] in core/completion_batch.h); then one task per runner (the
// function's inter-op pool) calls them all, and from a pool thread the
// executor queues the consumers locally, with no wake-up. A runner's threads
// can all be held by whatever waits for such a done() (an eager collective
// inside a py_function holds one while the collective completes), so a task
// that has not started 2 ms after its hand-over is run by the engine at its
// next cycle instead (the engine cycles at least every cycle time), and every
// task still waiting is run when an engine stops: a done() is never left
// waiting for a pool.
#pragma once

#include <functional>

#include "tensorflow/core/framework/op_kernel.h"

namespace hvdkeras {

// Calls `done` now, or holds it back for the context's runner as the note says.
void FinishKernel(tensorflow::OpKernelContext* ctx, std::function<void()> done);

}  // namespace hvdkeras

// Which agreed ops run in this cycle, and which wait for a later one.
#pragma once

#include <vector>

#include "core/pending_op.h"

namespace hvdkeras {

// Note [priority on the wire]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An op with priority above 0 (a cross-step gradient bucket: Note
// [cross-step updates] in hvdkeras/training/cross_step.py) does not run in
// the cycle that agrees on it. It joins the engine's held ops, kept sorted
// by priority (stably, so equal priorities keep the order they were agreed
// in), and each cycle runs every priority-0 op it agreed on plus the first
// held op. A bucket agreed while others wait therefore overtakes them at the
// next bucket boundary: the input layers' gradients, produced last by the
// backward pass and read first by the next forward pass, go on the wire
// first. Buckets are kept small (a few MiB) so that the boundary comes soon.
//
// Every rank agrees on the same ops in the same order each cycle, so every
// rank holds the same ops and runs the same collectives in the same order.
// Held ops are marked sent, so that the negotiation does not announce them
// again. A joined rank's stand-ins live for one cycle only
// (Negotiator::ClearStandIns), so a cycle that agrees on any stand-in runs
// everything held at once, in order.

// Adds this cycle's `agreed` ops to `held` and returns the ops to run now,
// in their order; the others stay in `held`, marked sent.
std::vector<PendingOp*> TakeRunnable(std::vector<PendingOp*> agreed,
                                     std::vector<PendingOp*>* held);

}  // namespace hvdkeras

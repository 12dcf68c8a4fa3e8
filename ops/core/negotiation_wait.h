// How a negotiation waits for the other ranks' status bits: politely (a
// waiting engine thread must not hog a core the framework needs), ending
// early on a device error, and keeping the buffer of a wait it abandoned.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

// Waits for `request`; `health` (may be empty) is asked while waiting, and
// its error ends the wait (the request stays in flight: Abandon it).
Status WaitPolitely(MPI_Request* request, const std::function<Status()>& health);

// Keeps an abandoned request and its buffer until MPI finishes it.
void Abandon(MPI_Request request, std::vector<uint64_t>&& buffer);

// Drops the abandoned requests MPI has finished; cheap when there are none.
void ReapAbandoned();

}  // namespace hvdkeras

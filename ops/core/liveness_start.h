// The start-up exchange of host liveness (Note [liveness tree] in liveness.h):
// who leads which host, where rank 0 and each leader listen, and which
// connections were made, agreed over MPI before the watchdog takes them.
#pragma once

#include <mpi.h>

#include "core/common.h"
#include "core/liveness.h"

namespace hvdkeras {

// Collective over `comm`. bound_seconds <= 0 on any rank turns liveness off
// on all. A rank that cannot reach its leader or rank 0 is left unwatched
// (rank 0 warns once, naming it). Fails on every rank, saying why, only
// when rank 0 cannot hold a connection per host under its descriptor limit.
Status StartLiveness(MPI_Comm comm, double bound_seconds, Liveness* liveness);

}  // namespace hvdkeras

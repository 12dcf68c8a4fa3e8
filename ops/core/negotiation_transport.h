// The exchanges a negotiation makes between ranks, behind an interface.
//
// Note [negotiation transport]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The Negotiator decides; a NegotiationTransport moves its bytes. The
// engine gives it the MPI one (negotiation_transport_mpi.cc); the control
// plane's stand-in harness (virtual_ranks.cc) gives each of its
// virtual ranks an in-memory one, so the real negotiation, coordinator and
// response cache run for thousands of ranks in one process, with the
// network's cost modelled instead of paid. Every call is collective: every
// rank makes it, in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

class NegotiationTransport {
 public:
  virtual ~NegotiationTransport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Bitwise AND of `bits` across ranks, in place. `health` (may be empty) is
  // asked while waiting; its error ends the wait and is returned, and the
  // exchange then keeps its own copy of the buffer until it finishes.
  virtual Status AllreduceAnd(std::vector<uint64_t>* bits,
                              const std::function<Status()>& health) = 0;

  // Every rank's record of `mine.size()` bytes (the same size on every rank),
  // rank-major, on every rank.
  virtual Status Allgather(const std::vector<char>& mine, std::vector<char>* all) = 0;

  // Rank 0 receives every rank's bytes: rank r's are
  // [offsets[r], offsets[r + 1]) of `gathered`. Other ranks receive nothing.
  virtual void GatherAtRoot(const std::string& mine, std::vector<char>* gathered,
                            std::vector<size_t>* offsets) = 0;

  // Rank 0's `bytes` on every rank.
  virtual void BroadcastFromRoot(std::string* bytes) = 0;

  // Rank 0 receives `mine.size()` doubles (the same count on every rank)
  // from every rank, rank-major.
  virtual void GatherDoublesAtRoot(const std::vector<double>& mine, std::vector<double>* all) = 0;
};

}  // namespace hvdkeras

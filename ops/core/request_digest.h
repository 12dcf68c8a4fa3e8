// Requests in few bytes, for the first step of a large job.
//
// Note [requests by signature hash]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the slow path every rank used to send rank 0 each new request in
// full: at 16,384 ranks and 300 tensors, 4.9 million requests of about 85
// bytes each. Now a rank sends a digest per request: a 64-bit hash of
// everything the ranks must agree on (the signature: name, op, types,
// shapes but for the first dimension where that may differ, scales, root,
// device), its age, and the numbers that are its own (an allgather's or
// alltoall's first dimensions, alltoall's splits). Rank 0 knows a signature
// when it submitted the same request itself or its coordinator already
// holds it; for the others it names one rank per unknown hash, and only
// those ranks send those requests in full, in a second gather in the same
// cycle (Negotiator::SlowPath). Ranks that sent something different have a
// different hash, so their request arrives whole and validation names it
// as before. A collision of two different signatures under one hash (odds
// about 2^-64 per pair) would be taken for agreement; each rank checks the
// agreed signature against its own before it runs (CheckAgreedSignature).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/message.h"

namespace hvdkeras {

uint64_t SignatureHash(const Request& request);

// The numbers of `request` that are its rank's own: for allgather and
// alltoall the first dimension of each tensor (0 for a scalar), then for
// alltoall its splits.
void AppendPerRankNumbers(const Request& request, std::vector<int64_t>* out);

// `signature` as rank `rank` sent it: its per-rank numbers replaced by
// `numbers` (as AppendPerRankNumbers wrote them) and its age set.
Request WithPerRankNumbers(const Request& signature, int rank, double age_seconds,
                           const int64_t* numbers, size_t count);

// Whether `mine` and `agreed` agree in everything validation compares
// (scales equal as numbers, or both NaN), per-rank numbers aside.
bool AgreesWith(const Request& mine, const Request& agreed);

std::string EncodeRequestDigests(const std::vector<Request>& requests);

// Walks one rank's encoded digests where they lie (rank 0 holds every
// rank's at once: nothing is copied out but one record's numbers).
class DigestReader {
 public:
  DigestReader(const char* data, size_t size) : data_(data), size_(size) {}
  // The next record; false at the end, or where the bytes are malformed
  // (then ok() is false).
  bool Next(uint64_t* hash, double* age, std::vector<int64_t>* numbers);
  bool ok() const { return ok_; }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Rank 0's list of the signatures it lacks: (hash, the rank to send it).
std::string EncodeWanted(const std::vector<std::pair<uint64_t, int32_t>>& wanted);
bool DecodeWanted(const char* data, size_t size, std::vector<std::pair<uint64_t, int32_t>>* out);

}  // namespace hvdkeras

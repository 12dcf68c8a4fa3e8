// Rank 0's bookkeeping for the slow negotiation path: collects the requests
// every rank sent for a name, decides when a name is ready on all ranks, and
// checks that the ranks agree. Pure logic with no MPI, so it is unit-testable.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/message.h"

namespace hvdkeras {

class Coordinator {
 public:
  explicit Coordinator(int size) : size_(size) {}

  // Records one rank's request. A name becomes ready when all ranks sent it;
  // ready names are queued in the order they became ready.
  void Add(const Request& request);

  // Returns the responses for names that became ready since the last call,
  // in the order they became ready, and forgets them.
  std::vector<Response> TakeReady();

  // Names some but not all ranks have sent, for diagnostics.
  size_t pending_count() const { return table_.size(); }

 private:
  struct Entry {
    std::vector<Request> by_rank;  // indexed by rank
    std::vector<bool> seen;        // which ranks have sent theirs
    int received = 0;
  };

  int size_;
  std::map<std::string, Entry> table_;
  std::vector<Response> ready_;
};

// Checks that all ranks' requests for one name agree. Returns "" when they
// do, or a message naming the tensor and what each rank sent.
std::string ValidateRequests(const std::vector<Request>& by_rank, int world_size);

}  // namespace hvdkeras

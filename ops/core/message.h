// Requests (what a rank wants to run) and responses (what the coordinator
// decided), with a compact binary encoding for the negotiation messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

// One named collective as submitted by one rank. A grouped op is a single
// request holding several tensors; its tensors always execute together.
struct Request {
  std::string name;
  int32_t rank = 0;
  OpType op_type = OpType::kAllreduce;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  DeviceKind device = DeviceKind::kCpu;  // where every tensor of the request lives
  std::vector<DataType> dtypes;  // one per tensor
  std::vector<Shape> shapes;     // one per tensor
  std::vector<int64_t> splits;   // alltoall: rows sent to each rank
  // 0: runs as soon as agreed. Above 0: agreed ops wait, and run one per
  // cycle, lowest first (Note [priority on the wire] in wire_order.h).
  int32_t priority = 0;
  double age_seconds = 0.0;      // how long the op had waited when sent (not compared)

  int64_t TotalBytes() const;
  // True when everything except the sending rank matches: the test the
  // response cache uses to decide whether a request repeats a known one.
  bool SameSignature(const Request& other) const;
};

struct Response {
  enum class Kind : int32_t { kOk = 0, kError = 1 };
  Kind kind = Kind::kOk;
  std::string name;
  std::string error;  // set when kind == kError; identical on every rank
  // The request every rank agreed on (a submitting rank's; per-rank fields
  // such as an allgather's first dimension are those of that rank). Ranks
  // that have joined build their stand-in contribution from it.
  Request agreed;
  // Allgather: first dimension of each tensor on each rank, tensor-major
  // ([t * size + r]). Alltoall: rows sent from rank s to rank d at
  // [s * size + d].
  std::vector<int64_t> sizes;
  int32_t last_joined_rank = -1;  // join: the last rank to join
};

std::string EncodeRequests(const std::vector<Request>& requests);
// Returns false if the bytes are malformed.
bool DecodeRequests(const char* data, size_t size, std::vector<Request>* out);

std::string EncodeResponses(const std::vector<Response>& responses);
bool DecodeResponses(const char* data, size_t size, std::vector<Response>* out);

}  // namespace hvdkeras

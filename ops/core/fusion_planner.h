// Tensor fusion planning: which ready requests share one buffer and one
// collective call. A pure function of its inputs, tested without MPI.
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"

namespace hvdkeras {

// What must match for two requests to share a fused buffer.
struct FusionKey {
  OpType op_type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;  // broadcasts move bytes: use kUInt8
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root_rank = 0;
  DeviceKind device = DeviceKind::kCpu;

  bool operator==(const FusionKey& o) const {
    return op_type == o.op_type && dtype == o.dtype && reduce_op == o.reduce_op &&
           prescale == o.prescale && postscale == o.postscale && root_rank == o.root_rank &&
           device == o.device;
  }
};

struct FusionItem {
  FusionKey key;
  int64_t bytes = 0;     // all tensors of the request together
  bool fusable = true;   // false: always a batch of its own (e.g. alltoall)
};

// Splits items (in their agreed execution order) into batches. Each batch is
// a list of item indices with one key whose summed bytes stay within
// `threshold_bytes`; an item is never split, so an item larger than the
// threshold forms a batch of its own, as does an item marked not fusable. Items are placed first-fit into the
// earliest open batch of their key, so interleaved keys still fuse. Batches
// are ordered by their first item. A threshold <= 0 disables fusion.
// Every rank computes the same plan from the same inputs.
std::vector<std::vector<int>> PlanFusion(const std::vector<FusionItem>& items,
                                         int64_t threshold_bytes);

}  // namespace hvdkeras

// Where each tensor of a fused device buffer lives, and which copies each
// batched-copy launch takes. Pure (no GPU, no MPI): tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace hvdkeras {

struct PackingPlan {
  std::vector<int64_t> offsets;  // byte offset of tensor i in the buffer
  int64_t total_bytes = 0;       // the buffer's size: the last tensor's end, aligned
  // Each launch covers tensors [first, second), in order: the ones among them
  // that hold data (at most `max_per_launch`) are its copies; empty tensors
  // have nothing to copy and are skipped.
  std::vector<std::pair<size_t, size_t>> launches;
};

// Lays tensors of `bytes` end to end, each starting at a multiple of
// `alignment` (> 0), and groups the copies into launches. Every rank that
// computes a plan from the same sizes gets the same plan.
PackingPlan PlanPacking(const std::vector<int64_t>& bytes, int64_t alignment,
                        int max_per_launch);

}  // namespace hvdkeras

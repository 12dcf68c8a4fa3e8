#include "core/device_packing.h"

namespace hvdkeras {

PackingPlan PlanPacking(const std::vector<int64_t>& bytes, int64_t alignment,
                        int max_per_launch) {
  PackingPlan plan;
  const auto align = [alignment](int64_t n) { return (n + alignment - 1) / alignment * alignment; };
  int64_t end = 0;
  for (int64_t b : bytes) {
    plan.offsets.push_back(end);
    end = align(end + b);
  }
  plan.total_bytes = end;
  size_t first = 0;
  int in_launch = 0;
  for (size_t i = 0; i <= bytes.size(); ++i) {
    const bool last = i == bytes.size();
    if (!last && bytes[i] == 0) {
      // An empty tensor has nothing to copy; a launch never starts with one.
      if (in_launch == 0) first = i + 1;
      continue;
    }
    if (!last && in_launch < max_per_launch) {
      ++in_launch;
      continue;
    }
    if (in_launch > 0) plan.launches.emplace_back(first, i);
    first = i;
    in_launch = last ? 0 : 1;
  }
  return plan;
}

}  // namespace hvdkeras

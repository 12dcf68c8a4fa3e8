#include "core/fusion_planner.h"

namespace hvdkeras {

std::vector<std::vector<int>> PlanFusion(const std::vector<FusionItem>& items,
                                         int64_t threshold_bytes) {
  std::vector<std::vector<int>> batches;
  std::vector<int64_t> batch_bytes;
  for (int i = 0; i < static_cast<int>(items.size()); ++i) {
    const FusionItem& item = items[i];
    int target = -1;
    if (threshold_bytes > 0 && item.fusable) {
      for (size_t b = 0; b < batches.size(); ++b) {
        if (items[batches[b][0]].fusable && items[batches[b][0]].key == item.key &&
            batch_bytes[b] + item.bytes <= threshold_bytes) {
          target = static_cast<int>(b);
          break;
        }
      }
    }
    if (target < 0) {
      batches.emplace_back();
      batch_bytes.push_back(0);
      target = static_cast<int>(batches.size()) - 1;
    }
    batches[target].push_back(i);
    batch_bytes[target] += item.bytes;
  }
  return batches;
}

}  // namespace hvdkeras

#include "core/wire_order.h"

#include <algorithm>

namespace hvdkeras {

std::vector<PendingOp*> TakeRunnable(std::vector<PendingOp*> agreed,
                                     std::vector<PendingOp*>* held) {
  bool any_priority = false, any_stand_in = false;
  for (const PendingOp* op : agreed) {
    any_priority = any_priority || op->request.priority > 0;
    any_stand_in = any_stand_in || op->done == nullptr;
  }
  if (held->empty() && !any_priority) return agreed;  // the common case: moved through
  held->insert(held->end(), agreed.begin(), agreed.end());
  std::stable_sort(held->begin(), held->end(), [](const PendingOp* a, const PendingOp* b) {
    return a->request.priority < b->request.priority;
  });
  std::vector<PendingOp*> runnable;
  if (any_stand_in) {
    runnable.swap(*held);
    return runnable;
  }
  size_t taken = 0;
  while (taken < held->size() && (*held)[taken]->request.priority == 0) ++taken;
  if (taken < held->size()) ++taken;  // the first prioritised op
  runnable.assign(held->begin(), held->begin() + static_cast<std::ptrdiff_t>(taken));
  held->erase(held->begin(), held->begin() + static_cast<std::ptrdiff_t>(taken));
  for (PendingOp* op : *held) op->sent = true;
  return runnable;
}

}  // namespace hvdkeras

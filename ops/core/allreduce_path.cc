#include "core/allreduce_path.h"

#include <algorithm>
#include <map>

namespace hvdkeras {

HostLayout LayoutOf(const std::vector<int>& host_of_rank) {
  std::map<int, int> ranks_on;
  for (int host : host_of_rank) ++ranks_on[host];
  HostLayout layout;
  if (ranks_on.empty()) return layout;
  layout.hosts = static_cast<int>(ranks_on.size());
  layout.min_local_size = ranks_on.begin()->second;
  layout.max_local_size = ranks_on.begin()->second;
  for (const auto& entry : ranks_on) {
    layout.min_local_size = std::min(layout.min_local_size, entry.second);
    layout.max_local_size = std::max(layout.max_local_size, entry.second);
  }
  return layout;
}

bool ChooseAllreducePath(const HostLayout& layout, bool shm_enabled,
                         const std::string& hierarchical, AllreducePath* path) {
  if (hierarchical != "auto" && hierarchical != "on" && hierarchical != "off") return false;
  if (!shm_enabled) {
    *path = AllreducePath::kMpi;
  } else if (layout.hosts == 1) {
    // One rank alone has nothing to share.
    *path = layout.max_local_size >= 2 ? AllreducePath::kShm : AllreducePath::kMpi;
  } else if (hierarchical == "on") {
    *path = AllreducePath::kHierarchical;
  } else if (hierarchical == "off") {
    *path = AllreducePath::kMpi;
  } else {
    // With one rank per host the cross step is the whole allreduce: the
    // shared-memory steps around it would only add copies.
    *path = layout.max_local_size >= 2 ? AllreducePath::kHierarchical : AllreducePath::kMpi;
  }
  return true;
}

const char* AllreducePathName(AllreducePath path) {
  switch (path) {
    case AllreducePath::kShm: return "shm";
    case AllreducePath::kHierarchical: return "hierarchical";
    case AllreducePath::kMpi: break;
  }
  return "mpi";
}

}  // namespace hvdkeras

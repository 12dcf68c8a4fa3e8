#include "core/host_topology.h"

#include <vector>

namespace hvdkeras {

Status HostTopology::Open(MPI_Comm comm, bool shm_enabled, const std::string& hierarchical) {
  Close(false);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local_) !=
      MPI_SUCCESS) {
    return Status::Error(StatusCode::kUnknown, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  }
  int local_rank = 0;
  MPI_Comm_rank(local_, &local_rank);
  // A host is named by the lowest rank on it.
  int host_leader = local_rank == 0 ? rank : 0;
  MPI_Bcast(&host_leader, 1, MPI_INT, 0, local_);
  std::vector<int> leaders(size);
  MPI_Allgather(&host_leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm);
  layout_ = LayoutOf(leaders);
  if (!ChooseAllreducePath(layout_, shm_enabled, hierarchical, &path_)) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "hierarchical_allreduce must be auto, on or off, not '" + hierarchical +
                             "'");
  }
  // Every host has local ranks 0..slices()-1: each such rank joins its
  // peers on the other hosts.
  const int color = local_rank < slices() ? local_rank : MPI_UNDEFINED;
  if (MPI_Comm_split(comm, color, rank, &cross_) != MPI_SUCCESS) {
    return Status::Error(StatusCode::kUnknown, "MPI_Comm_split of the cross communicator failed");
  }
  return Status::OK();
}

void HostTopology::Close(bool collective) {
  if (collective) {
    if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
    if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
  }
  cross_ = MPI_COMM_NULL;
  local_ = MPI_COMM_NULL;
  path_ = AllreducePath::kMpi;
  layout_ = HostLayout();
}

}  // namespace hvdkeras

// The hosts the ranks of a communicator run on: the communicator of this
// rank's host, the cross communicator of the hierarchical allreduce, and the
// allreduce path the layout and the settings choose (allreduce_path.h).
#pragma once

#include <mpi.h>

#include <string>

#include "core/allreduce_path.h"
#include "core/common.h"

namespace hvdkeras {

class HostTopology {
 public:
  // Collective over `comm`. Ranks share a host when MPI says they share
  // memory (MPI_COMM_TYPE_SHARED).
  Status Open(MPI_Comm comm, bool shm_enabled, const std::string& hierarchical);
  // Frees the communicators; `collective` false only forgets them (after a
  // failure, when the other ranks may not get here).
  void Close(bool collective);

  AllreducePath path() const { return path_; }
  const HostLayout& layout() const { return layout_; }
  // This rank's host.
  MPI_Comm local() const { return local_; }
  // Local rank i (i < slices()) of every host; MPI_COMM_NULL on the others.
  MPI_Comm cross() const { return cross_; }
  int slices() const { return layout_.min_local_size; }

 private:
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  HostLayout layout_;
  AllreducePath path_ = AllreducePath::kMpi;
};

}  // namespace hvdkeras

#include "core/negotiation_transport_mpi.h"

#include <algorithm>

#include "core/negotiation_wait.h"

namespace hvdkeras {

Status MpiNegotiationTransport::AllreduceAnd(std::vector<uint64_t>* bits,
                                             const std::function<Status()>& health) {
  ReapAbandoned();
  MPI_Request request;
  MPI_Iallreduce(MPI_IN_PLACE, bits->data(), static_cast<int>(bits->size()), MPI_UINT64_T,
                 MPI_BAND, mpi_->comm(), &request);
  Status status = WaitPolitely(&request, health);
  if (!status.ok() && request != MPI_REQUEST_NULL) {
    // Note [an abandoned negotiation keeps its buffer]
    Abandon(request, std::move(*bits));
  }
  return status;
}

Status MpiNegotiationTransport::Allgather(const std::vector<char>& mine, std::vector<char>* all) {
  const int bytes = static_cast<int>(mine.size());
  all->assign(static_cast<size_t>(bytes) * mpi_->size(), '\0');
  if (MPI_Allgather(mine.data(), bytes, MPI_CHAR, all->data(), bytes, MPI_CHAR, mpi_->comm()) !=
      MPI_SUCCESS) {
    return Status::Error(StatusCode::kUnknown, "MPI_Allgather failed");
  }
  return Status::OK();
}

void MpiNegotiationTransport::GatherAtRoot(const std::string& mine, std::vector<char>* gathered,
                                           std::vector<size_t>* offsets) {
  const int size = mpi_->size();
  const bool root = mpi_->rank() == 0;
  int my_bytes = static_cast<int>(mine.size());
  std::vector<int> counts(root ? size : 0);
  MPI_Gather(&my_bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, mpi_->comm());
  std::vector<int> displs(counts.size(), 0);
  offsets->assign(root ? size + 1 : 0, 0);
  if (root) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = total;
      (*offsets)[r] = static_cast<size_t>(total);
      total += counts[r];
    }
    (*offsets)[size] = static_cast<size_t>(total);
    gathered->resize(std::max(total, 1));
  }
  MPI_Gatherv(mine.data(), my_bytes, MPI_BYTE, gathered->data(), counts.data(), displs.data(),
              MPI_BYTE, 0, mpi_->comm());
}

void MpiNegotiationTransport::BroadcastFromRoot(std::string* bytes) {
  int count = static_cast<int>(bytes->size());
  MPI_Bcast(&count, 1, MPI_INT, 0, mpi_->comm());
  bytes->resize(count);
  MPI_Bcast(bytes->data(), count, MPI_BYTE, 0, mpi_->comm());
}

void MpiNegotiationTransport::GatherDoublesAtRoot(const std::vector<double>& mine,
                                                  std::vector<double>* all) {
  const int count = static_cast<int>(mine.size());
  all->assign(mpi_->rank() == 0 ? mine.size() * mpi_->size() : 0, 0.0);
  if (count == 0) return;
  MPI_Gather(mine.data(), count, MPI_DOUBLE, all->data(), count, MPI_DOUBLE, 0, mpi_->comm());
}

}  // namespace hvdkeras

// The negotiation's exchanges over MPI (Note [negotiation transport]).
#pragma once

#include "core/mpi_context.h"
#include "core/negotiation_transport.h"

namespace hvdkeras {

class MpiNegotiationTransport : public NegotiationTransport {
 public:
  // `mpi` must outlive the transport's use.
  explicit MpiNegotiationTransport(const MpiContext* mpi = nullptr) : mpi_(mpi) {}

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  Status AllreduceAnd(std::vector<uint64_t>* bits,
                      const std::function<Status()>& health) override;
  Status Allgather(const std::vector<char>& mine, std::vector<char>* all) override;
  void GatherAtRoot(const std::string& mine, std::vector<char>* gathered,
                    std::vector<size_t>* offsets) override;
  void BroadcastFromRoot(std::string* bytes) override;
  void GatherDoublesAtRoot(const std::vector<double>& mine, std::vector<double>* all) override;

 private:
  const MpiContext* mpi_;
};

}  // namespace hvdkeras

// A NegotiationTransport that counts the CPU its calls take on the calling
// thread, around another transport (Note [negotiation transport]).
//
// The negotiation's own work at a rank is its CPU time minus the time spent
// inside exchanges: over MPI a waiting rank spins, in the stand-in the hub
// does the network's copying, and neither is the negotiation's cost. The
// engine and the stand-in both count it this way (NegotiationCounts::
// own_cpu_ns), so their figures compare.
#pragma once

#include <time.h>

#include "core/negotiation_transport.h"

namespace hvdkeras {

inline int64_t ThreadCpuNanoseconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + static_cast<int64_t>(t.tv_nsec);
}

class CpuTimedTransport final : public NegotiationTransport {
 public:
  void Wrap(NegotiationTransport* inner) { inner_ = inner; }
  // The calling threads' CPU inside the wrapped calls, in total.
  int64_t nanoseconds_inside() const { return inside_ns_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllreduceAnd(std::vector<uint64_t>* bits,
                      const std::function<Status()>& health) override {
    Timed timed(this);
    return inner_->AllreduceAnd(bits, health);
  }
  Status Allgather(const std::vector<char>& mine, std::vector<char>* all) override {
    Timed timed(this);
    return inner_->Allgather(mine, all);
  }
  void GatherAtRoot(const std::string& mine, std::vector<char>* gathered,
                    std::vector<size_t>* offsets) override {
    Timed timed(this);
    inner_->GatherAtRoot(mine, gathered, offsets);
  }
  void BroadcastFromRoot(std::string* bytes) override {
    Timed timed(this);
    inner_->BroadcastFromRoot(bytes);
  }
  void GatherDoublesAtRoot(const std::vector<double>& mine, std::vector<double>* all) override {
    Timed timed(this);
    inner_->GatherDoublesAtRoot(mine, all);
  }

 private:
  struct Timed {
    explicit Timed(CpuTimedTransport* t) : transport(t), start(ThreadCpuNanoseconds()) {}
    ~Timed() { transport->inside_ns_ += ThreadCpuNanoseconds() - start; }
    CpuTimedTransport* transport;
    int64_t start;
  };

  NegotiationTransport* inner_ = nullptr;
  int64_t inside_ns_ = 0;
};

}  // namespace hvdkeras

#include "core/negotiation_wait.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

namespace hvdkeras {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// Waits for a nonblocking MPI request without hogging a core: spin briefly
// (the common case: the other ranks are already there), then yield, then
// sleep for a small fraction of the time waited so far.
//
// Note [device errors end the negotiation wait]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A GPU communicator's asynchronous error (a lost peer) ends the engine of
// every rank that sees it, at the start of a cycle (Engine::RunCycle). A rank
// whose engine had already entered this cycle's negotiation would wait for
// the ended ranks' status bits forever, so while sleeping here it asks
// `health` too, and its error ends the wait and the engine the same way.
Status WaitPolitely(MPI_Request* request, const std::function<Status()>& health) {
  const auto start = Clock::now();
  int done = 0;
  while (true) {
    int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return Status::Error(StatusCode::kUnknown, "MPI_Test failed");
    if (done) return Status::OK();
    const auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(1)) {
      std::this_thread::yield();
      continue;
    }
    if (health) {
      Status s = health();
      if (!s.ok()) return s;
    }
    std::this_thread::sleep_for(
        std::min<Clock::duration>(waited / 20, std::chrono::microseconds(500)));
  }
}

// Note [an abandoned negotiation keeps its buffer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// MPI cannot cancel a collective. When a device error ends the wait above,
// the status-bit allreduce stays in flight: the ranks that did enter it go
// on sending their parts, and MPI's progress engine (run by any later MPI
// call on any thread) writes them into this rank's buffer. Freeing that
// buffer with the negotiation's locals corrupted the heap of the next
// engine. So the request and its buffer move here, a list that outlives
// every engine; each later negotiation drops the ones MPI has finished.
namespace {

struct AbandonedReduction {
  MPI_Request request;
  std::vector<uint64_t> buffer;  // moving a vector keeps its storage in place
};

std::mutex& AbandonedMutex() {
  static std::mutex* mu = new std::mutex();  // never destroyed: see the Note
  return *mu;
}

std::deque<AbandonedReduction>& Abandoned() {
  static auto* list = new std::deque<AbandonedReduction>();
  return *list;
}

// How many are listed: read without the lock, so a cycle with nothing to
// reap (all but the rare ones after a device error) costs one atomic load.
std::atomic<size_t> g_abandoned_count{0};

}  // namespace

void Abandon(MPI_Request request, std::vector<uint64_t>&& buffer) {
  std::lock_guard<std::mutex> lock(AbandonedMutex());
  Abandoned().push_back({request, std::move(buffer)});
  g_abandoned_count.store(Abandoned().size());
}

void ReapAbandoned() {
  if (g_abandoned_count.load() == 0) return;
  std::lock_guard<std::mutex> lock(AbandonedMutex());
  std::deque<AbandonedReduction>& list = Abandoned();
  for (auto it = list.begin(); it != list.end();) {
    int done = 0;
    if (MPI_Test(&it->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
      it = list.erase(it);
    } else {
      ++it;
    }
  }
  g_abandoned_count.store(list.size());
}

}  // namespace hvdkeras

#include "core/virtual_ranks.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>

#include "core/liveness_rules.h"
#include "core/negotiation.h"

namespace hvdkeras {

namespace {

// The virtual ranks' meeting point: each collective call leaves its
// rank's buffers here and waits; the last to arrive does the exchange for
// everyone (the work of the network, not of any rank).
class Hub {
 public:
  explicit Hub(int size) : size_(size), slots_(size) {}

  struct Slot {
    std::vector<uint64_t>* bits = nullptr;
    const std::vector<char>* record = nullptr;
    std::vector<char>* all = nullptr;
    const std::string* mine = nullptr;
    std::vector<size_t>* offsets = nullptr;
    std::string* bytes = nullptr;
    const std::vector<double>* doubles = nullptr;
    std::vector<double>* all_doubles = nullptr;
  };

  template <typename Exchange>
  void Meet(int rank, const Slot& slot, Exchange exchange) {
    std::unique_lock<std::mutex> lock(mutex_);
    slots_[rank] = slot;
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      exchange(slots_);
      arrived_ = 0;
      ++generation_;
      met_.notify_all();
    } else {
      met_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  int size_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable met_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// Every rank's `part` of its slot, one after another in rank order.
template <typename T, typename Part>
std::vector<T> Concatenated(const std::vector<Hub::Slot>& slots, Part part) {
  std::vector<T> out;
  for (const Hub::Slot& s : slots) out.insert(out.end(), part(s).begin(), part(s).end());
  return out;
}

// One virtual rank's transport: every call meets the others at the hub.
// Rank 0's counts say what reached it; its time inside is kept apart.
class HubTransport : public NegotiationTransport {
 public:
  HubTransport(Hub* hub, int rank, int size) : hub_(hub), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status AllreduceAnd(std::vector<uint64_t>* bits, const std::function<Status()>&) override {
    ++counts.allreduces;
    counts.allreduce_bytes += static_cast<int64_t>(bits->size() * 8);
    Hub::Slot slot;
    slot.bits = bits;
    hub_->Meet(rank_, slot, [](std::vector<Hub::Slot>& slots) {
      std::vector<uint64_t> result = *slots[0].bits;
      for (const Hub::Slot& s : slots) {
        for (size_t w = 0; w < result.size() && w < s.bits->size(); ++w) result[w] &= (*s.bits)[w];
      }
      for (Hub::Slot& s : slots) *s.bits = result;
    });
    return Status::OK();
  }

  Status Allgather(const std::vector<char>& mine, std::vector<char>* all) override {
    Hub::Slot slot;
    slot.record = &mine;
    slot.all = all;
    hub_->Meet(rank_, slot, [](std::vector<Hub::Slot>& slots) {
      const std::vector<char> joined =
          Concatenated<char>(slots, [](const Hub::Slot& s) -> const auto& { return *s.record; });
      for (Hub::Slot& s : slots) *s.all = joined;
    });
    return Status::OK();
  }

  void GatherAtRoot(const std::string& mine, std::vector<char>* gathered,
                    std::vector<size_t>* offsets) override {
    Hub::Slot slot;
    slot.mine = &mine;
    slot.all = gathered;
    slot.offsets = offsets;
    hub_->Meet(rank_, slot, [](std::vector<Hub::Slot>& slots) {
      std::vector<char>& out = *slots[0].all;
      std::vector<size_t>& at = *slots[0].offsets;
      out.clear();
      at.clear();
      for (const Hub::Slot& s : slots) {
        at.push_back(out.size());
        out.insert(out.end(), s.mine->begin(), s.mine->end());
      }
      at.push_back(out.size());
      for (size_t r = 1; r < slots.size(); ++r) slots[r].offsets->clear();
    });
    if (rank_ == 0) {
      ++counts.gathers;
      counts.gather_bytes_at_root += static_cast<int64_t>(gathered->size());
    }
  }

  void BroadcastFromRoot(std::string* bytes) override {
    Hub::Slot slot;
    slot.bytes = bytes;
    hub_->Meet(rank_, slot, [](std::vector<Hub::Slot>& slots) {
      for (size_t r = 1; r < slots.size(); ++r) *slots[r].bytes = *slots[0].bytes;
    });
    ++counts.broadcasts;
    counts.broadcast_bytes += static_cast<int64_t>(bytes->size());
  }

  void GatherDoublesAtRoot(const std::vector<double>& mine, std::vector<double>* all) override {
    Hub::Slot slot;
    slot.doubles = &mine;
    slot.all_doubles = all;
    hub_->Meet(rank_, slot, [](std::vector<Hub::Slot>& slots) {
      *slots[0].all_doubles =
          Concatenated<double>(slots, [](const Hub::Slot& s) -> const auto& { return *s.doubles; });
    });
  }

  ExchangeCounts counts;

 private:
  Hub* hub_;
  int rank_;
  int size_;
};

// What a virtual rank sends for tensor `t` of a step.
Request RequestFor(const VirtualJob& job, int rank, int t) {
  Request r;
  r.name = "step.grad." + std::to_string(t);
  r.rank = rank;
  r.dtypes = {DataType::kFloat32};
  if (t < job.allgathers) {
    r.op_type = OpType::kAllgather;
    r.shapes = {{1 + rank % 3, 8}};
  } else {
    r.op_type = OpType::kAllreduce;
    r.reduce_op = ReduceOp::kAverage;
    r.shapes = {{1024 + t}};
  }
  return r;
}

// Holds the threads until all of them exist, or tells them to leave when
// some could not be made (a hub missing ranks would wait forever).
struct StartGate {
  std::mutex mutex;
  std::condition_variable opened;
  bool open = false;
  bool go = false;
};

struct RankRun {
  const VirtualJob* job = nullptr;
  StartGate* gate = nullptr;
  Hub* hub = nullptr;
  int rank = 0;
  VirtualJobReport* report = nullptr;  // rank 0 fills it
  uint64_t order_hash = 1469598103934665603ull;
  bool exact = true;
  std::string error;
};

// Note [a cold rank 0]
// ~~~~~~~~~~~~~~~~~~~~
// A real rank 0 meets each cycle with its negotiation's state (its pending
// ops, the cache's entries, the coordinator's tables) mostly out of its
// caches: the framework computes between the engine's cycles, on the same
// core, and with more ranks than cores other processes run there too. The
// stand-in's virtual ranks share one process and one cache hierarchy
// instead, so rank 0's state is warm at 64 ranks (all of them fit the last
// level) and cold at 16,384 (gigabytes of other ranks' state pass through
// it), which makes the same code look slower at 16,384 for a reason no real
// job has. With rank0_evict_bytes set, rank 0 writes a buffer of that size
// before each cycle, outside the timed part: twice the last level, and its
// state is cold at every size, as a real rank 0's is; twice its core's own
// caches, and only those are. Writing the last level's size takes tens of
// milliseconds, in which most other virtual ranks reach the cycle's
// allreduce, so fewer of them run beside the timed part (none is held back
// for it). The benchmark reports which model it ran.
class CacheEvictor {
 public:
  explicit CacheEvictor(int64_t bytes) : buffer_(static_cast<size_t>(std::max<int64_t>(0, bytes))) {}
  void Evict() {
    // One write to every cache line makes the buffer the caches' content.
    for (size_t i = 0; i < buffer_.size(); i += 64) buffer_[i] = static_cast<char>(buffer_[i] + 1);
  }

 private:
  std::vector<char> buffer_;
};

void RunRank(RankRun* run) {
  const VirtualJob& job = *run->job;
  HubTransport transport(run->hub, run->rank, job.ranks);
  EngineConfig config;
  config.cache_capacity = job.cache_capacity;
  config.stall_check_seconds = 0;  // the threads' wall time is not a job's
  config.stall_shutdown_seconds = 0;
  Negotiator negotiator;
  negotiator.Reset(&transport, config);
  PendingOps pending;
  CacheEvictor evictor(run->rank == 0 ? job.rank0_evict_bytes : 0);
  std::mt19937_64 random(job.seed * 1000003u + static_cast<uint64_t>(run->rank));
  // A straggler hands each step over a cycle late.
  const int late = run->rank >= job.ranks - job.stragglers ? 1 : 0;
  const int spread = std::min(std::max(1, job.arrival_cycles), std::max(1, job.tensors));
  for (int step = 0; step < job.steps; ++step) {
    std::vector<int> order(job.tensors);
    for (int t = 0; t < job.tensors; ++t) order[t] = t;
    if (job.shuffled) std::shuffle(order.begin(), order.end(), random);
    int done = 0;
    for (int cycle = 0; done < job.tensors; ++cycle) {
      if (cycle >= late && cycle < late + spread) {
        // This cycle's share of the step's tensors, in this rank's order.
        const int part = cycle - late;
        const int begin = static_cast<int>(static_cast<int64_t>(job.tensors) * part / spread);
        const int end = static_cast<int>(static_cast<int64_t>(job.tensors) * (part + 1) / spread);
        for (int i = begin; i < end; ++i) {
          const int t = order[i];
          auto op = std::make_unique<PendingOp>();
          op->request = RequestFor(job, run->rank, t);
          op->enqueued = std::chrono::steady_clock::now();
          pending.Add(std::move(op));
        }
      }
      evictor.Evict();
      const int64_t cpu_before = negotiator.counts().own_cpu_ns;
      transport.counts = ExchangeCounts();
      Agreement agreement = negotiator.Negotiate(pending, CycleSignals(), std::chrono::steady_clock::now());
      const double cpu = 1e-9 * static_cast<double>(negotiator.counts().own_cpu_ns - cpu_before);
      if (!agreement.error.ok() || !agreement.failed.empty()) {
        run->error = !agreement.error.ok() ? agreement.error.message
                                           : agreement.failed[0].second.message;
        return;  // the failures are agreed, so every rank leaves in this cycle
      }
      for (PendingOp* op : agreement.ready) {
        for (char c : op->request.name) run->order_hash = (run->order_hash ^ c) * 1099511628211ull;
        if (op->request.op_type == OpType::kAllgather) {
          const std::vector<int64_t>& rows = op->response->sizes;
          for (int r = 0; r < job.ranks; ++r) run->exact &= rows[r] == 1 + r % 3;
        }
        op->finished = true;
        if (run->rank == 0) run->report->order.push_back(op->request.name);
      }
      done += static_cast<int>(agreement.ready.size());
      pending.TakeFinished();
      if (run->rank == 0) {
        VirtualCycle record;
        record.step = step;
        record.rank0_cpu_s = cpu;
        record.cached = static_cast<int64_t>(agreement.cached_count);
        record.negotiated = static_cast<int64_t>(agreement.ready.size() - agreement.cached_count);
        record.exchanges = transport.counts;
        run->report->cycles.push_back(record);
        run->report->rank0_table_peak_bytes =
            std::max(run->report->rank0_table_peak_bytes, negotiator.CoordinatorPeakBytes());
      }
    }
  }
}

void* RunRankThread(void* arg) {
  RankRun* run = static_cast<RankRun*>(arg);
  {
    std::unique_lock<std::mutex> lock(run->gate->mutex);
    run->gate->opened.wait(lock, [&] { return run->gate->open; });
    if (!run->gate->go) return nullptr;
  }
  RunRank(run);
  return nullptr;
}

}  // namespace

VirtualJobReport RunVirtualJob(const VirtualJob& job) {
  VirtualJobReport report;
  if (job.ranks < 1 || job.tensors < 1 || job.steps < 1 || job.allgathers > job.tensors ||
      job.stragglers >= job.ranks || job.ranks_per_host < 1) {
    report.error = "invalid virtual job: need ranks >= 1, tensors >= 1, steps >= 1, "
                   "allgathers <= tensors, stragglers < ranks and ranks_per_host >= 1";
    return report;
  }
  std::vector<std::string> host_of_rank(job.ranks);
  for (int r = 0; r < job.ranks; ++r) {
    host_of_rank[r] = "h" + std::to_string(r / job.ranks_per_host);
  }
  report.rank0_liveness_sockets = PlanLivenessTree(host_of_rank).ReportsTo(0);
  Hub hub(job.ranks);
  StartGate gate;
  std::vector<RankRun> runs(job.ranks);
  std::vector<pthread_t> threads(job.ranks);
  pthread_attr_t attr, rank0_attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);  // thousands of threads: small stacks
  pthread_attr_init(&rank0_attr);
  pthread_attr_setstacksize(&rank0_attr, 256 * 1024);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (job.rank0_own_core && sched_getaffinity(0, sizeof(allowed), &allowed) == 0 &&
      CPU_COUNT(&allowed) >= 2) {
    cpu_set_t first, rest = allowed;
    CPU_ZERO(&first);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed)) {
        CPU_SET(cpu, &first);
        CPU_CLR(cpu, &rest);
        break;
      }
    }
    pthread_attr_setaffinity_np(&rank0_attr, sizeof(first), &first);
    pthread_attr_setaffinity_np(&attr, sizeof(rest), &rest);
  }
  int started = 0;
  for (int r = 0; r < job.ranks; ++r) {
    runs[r].job = &job;
    runs[r].hub = &hub;
    runs[r].gate = &gate;
    runs[r].rank = r;
    runs[r].report = &report;
    if (pthread_create(&threads[r], r == 0 ? &rank0_attr : &attr, RunRankThread, &runs[r]) != 0) {
      break;
    }
    ++started;
  }
  pthread_attr_destroy(&attr);
  pthread_attr_destroy(&rank0_attr);
  {
    std::lock_guard<std::mutex> lock(gate.mutex);
    gate.open = true;
    gate.go = started == job.ranks;
  }
  gate.opened.notify_all();
  for (int r = 0; r < started; ++r) pthread_join(threads[r], nullptr);
  if (started < job.ranks) {
    report.error = "could only start " + std::to_string(started) + " of " +
                   std::to_string(job.ranks) + " virtual-rank threads (raise ulimit -u, or "
                   "run fewer virtual ranks)";
    return report;
  }
  report.agreed = true;
  report.exact = true;
  for (const RankRun& run : runs) {
    if (!run.error.empty() && report.error.empty()) {
      report.error = "rank " + std::to_string(run.rank) + ": " + run.error;
    }
    report.agreed &= run.order_hash == runs[0].order_hash;
    report.exact &= run.exact;
  }
  return report;
}

}  // namespace hvdkeras

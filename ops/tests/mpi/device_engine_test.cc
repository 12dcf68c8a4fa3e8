// The engine's GPU paths end to end (engine thread, negotiation, DeviceSession,
// collective_device_*.cc), on real MPI ranks with a STAND-IN device backend
// registered in place of CUDA and NCCL: LaneDevice keeps "device" memory on
// the host and records, per lane (Note [device lanes] in core/device.h),
// which thread used it and every stream wait and release; LaneCommunicator
// moves host bytes over an MPI communicator of its own per lane. No GPU can
// run here, so the stand-ins do only what the engine asks of a device, with
// failures injected where a real one could fail. What is checked is the
// engine's own logic:
// * two process sets reduce at once, each on its own lane: no scratch
//   buffer is shared, each lane is used by one thread only, results exact;
// * a batch that fails after queueing work (scratch growth, the
//   communicator's call, an output allocation) still makes the framework's
//   streams wait before its ops' done callbacks run;
// * a GPU set-up failure on one rank fails the first GPU collective on every
//   rank with the reason, and a later one sets up and works;
// * an error the communicator meets on its own ends the engine on every
//   rank: the ops waiting fail with it;
// * a rank whose first GPU batch holds only a joined rank's stand-ins uses
//   the GPU it was pinned to;
// * an output allocation that fails on one rank only fails there, while
//   the other ranks' exchange finishes with exact values;
// * a negotiation that a device error ended while other ranks were still
//   on their way keeps its buffer for the bits they send later.
// Driven by tests/test_device_collectives.py under mpiexec with 2 and 3 ranks.
#include <mpi.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/collectives.h"
#include "core/device.h"
#include "core/engine.h"
#include "core/engine_api.h"
#include "core/negotiation.h"
#include "core/negotiation_transport_mpi.h"
#include "core/scaling.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::DeviceCopy;
using hvdkeras::DeviceLane;
using hvdkeras::DeviceSegment;
using hvdkeras::ReduceOp;
using hvdkeras::Status;
using hvdkeras::StatusCode;
using hvdkeras::TensorRef;

struct MpiSession {
  MpiSession() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  ~MpiSession() { MPI_Finalize(); }
} g_mpi;

int Rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

Status Injected(const std::string& where) {
  return Status::Error(StatusCode::kUnknown, "injected failure in " + where);
}

// What the engine asked of the stand-ins, in order, from every thread.
std::mutex g_log_mu;
std::vector<std::string> g_log;
void Log(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log.push_back(line);
}
void ClearLog() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log.clear();
}
size_t Find(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  for (size_t i = 0; i < g_log.size(); ++i) {
    if (g_log[i] == line) return i;
  }
  return std::string::npos;
}

// Failures to inject, by name ("scratch", "allreduce", "prepare", "async").
std::mutex g_fail_mu;
std::set<std::string> g_fail;
bool Failing(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_fail_mu);
  return g_fail.count(what) > 0;
}
void SetFailing(const std::string& what, bool on) {
  std::lock_guard<std::mutex> lock(g_fail_mu);
  if (on) {
    g_fail.insert(what);
  } else {
    g_fail.erase(what);
  }
}

std::string StreamName(void* stream) { return std::to_string(reinterpret_cast<intptr_t>(stream)); }

class LaneDevice : public hvdkeras::Device {
 public:
  std::string Describe() const override { return "lane stand-in"; }
  int DeviceCount() const override { return 2; }
  std::string Identity(int device) const override {
    return "stand-in GPU " + std::to_string(device) + " of rank " + std::to_string(Rank());
  }
  Status PointerDevice(const void*, int* device) const override {
    *device = 0;
    return Status::OK();
  }
  Status RecordReady(int, void* stream, void** event) override {
    Log("ready " + StreamName(stream));
    *event = nullptr;
    return Status::OK();
  }
  void Discard(void*) override {}
  Status Prepare(const DeviceLane& where) override {
    Log("prepare " + std::to_string(where.device) + " " + std::to_string(where.lane));
    return Failing("prepare") ? Injected("prepare") : Use(where);
  }
  Status WaitFor(const DeviceLane& where, void*) override { return Use(where); }
  Status WaitForStream(const DeviceLane& where, void* stream) override {
    Log("wait " + StreamName(stream));
    return Use(where);
  }
  Status Release(const DeviceLane& where, void* stream) override {
    Log("release " + StreamName(stream));
    return Use(where);
  }
  Status Synchronize(const DeviceLane& where) override {
    Log("synchronize");
    return Use(where);
  }
  Status Scratch(const DeviceLane& where, int slot, int64_t bytes, void** data) override {
    Status s = Use(where);
    if (!s.ok()) return s;
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char>& buffer = scratch_[{where.device, where.lane}][slot];
    if (static_cast<int64_t>(buffer.size()) < bytes) {
      if (Failing("scratch")) return Injected("scratch growth");
      buffer.assign(bytes, '\x5a');
    }
    *data = buffer.data();
    owners_[*data].insert(where.lane);
    return Status::OK();
  }
  Status CopyScaled(const DeviceLane& where, DataType dtype, const std::vector<DeviceCopy>& copies,
                    double factor) override {
    for (const DeviceCopy& c : copies) hvdkeras::ScaleCopy(dtype, c.src, c.dst, c.count, factor);
    return Use(where);
  }
  Status CopyFinalized(const DeviceLane& where, DataType dtype,
                       const std::vector<DeviceCopy>& copies, int divisor,
                       double factor) override {
    for (const DeviceCopy& c : copies) {
      hvdkeras::FinalizeCopy(dtype, c.src, c.dst, c.count, divisor, factor);
    }
    return Use(where);
  }
  Status FillNeutral(const DeviceLane& where, DataType dtype, ReduceOp op, void* data,
                     int64_t count) override {
    hvdkeras::FillNeutral(dtype, op, data, count);
    return Use(where);
  }
  Status Zero(const DeviceLane& where, void* data, int64_t bytes) override {
    std::memset(data, 0, bytes);
    return Use(where);
  }
  // The stand-in's work is done when queued: a mark is reached when made.
  Status MarkTime(const DeviceLane&, void** mark) override {
    *mark = new std::chrono::steady_clock::time_point(std::chrono::steady_clock::now());
    return Status::OK();
  }
  Status MarkedTime(void* mark, bool* reached,
                    std::chrono::steady_clock::time_point* when) override {
    *reached = true;
    *when = *static_cast<std::chrono::steady_clock::time_point*>(mark);
    return Status::OK();
  }
  void ReleaseMark(void* mark) override {
    delete static_cast<std::chrono::steady_clock::time_point*>(mark);
  }
  void ReleaseLane(int lane) override {
    Log("release lane " + std::to_string(lane));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = scratch_.begin(); it != scratch_.end();) {
      it = it->first.second == lane ? scratch_.erase(it) : std::next(it);
    }
  }

  // Lanes whose scratch buffers another lane used too (none is allowed).
  std::vector<void*> SharedBuffers() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<void*> shared;
    for (const auto& [buffer, lanes] : owners_) {
      if (lanes.size() > 1) shared.push_back(buffer);
    }
    return shared;
  }
  // Lanes used by more than one thread (none is allowed).
  std::vector<int> LanesOfSeveralThreads() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> out;
    for (const auto& [lane, threads] : threads_) {
      if (threads.size() > 1) out.push_back(lane.second);
    }
    return out;
  }
  std::set<int> DevicesUsed() {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<int> out;
    for (const auto& [lane, threads] : threads_) out.insert(lane.first);
    return out;
  }

 private:
  Status Use(const DeviceLane& where) {
    std::lock_guard<std::mutex> lock(mu_);
    threads_[{where.device, where.lane}].insert(std::this_thread::get_id());
    return Status::OK();
  }

  std::mutex mu_;
  std::map<std::pair<int, int>, std::map<int, std::vector<char>>> scratch_;
  std::map<void*, std::set<int>> owners_;
  std::map<std::pair<int, int>, std::set<std::thread::id>> threads_;
};

LaneDevice& TheDevice() {
  static LaneDevice* device = new LaneDevice();
  return *device;
}

// One MPI communicator per lane, made by every rank at start.
std::map<int, MPI_Comm>& LaneComms() {
  static std::map<int, MPI_Comm> comms;
  return comms;
}

// Like NCCL's, the stand-in's calls return without waiting for a peer that
// never makes the matching call: each waits briefly for its MPI requests
// (a healthy peer answers within milliseconds), and past that leaves them
// "on the stream" unfinished, as a GPU kernel waiting for a failed peer
// would be, and returns. Each communicator has an MPI communicator of its
// own, so requests left behind never meet a later communicator's.
class LaneCommunicator : public hvdkeras::DeviceCommunicator {
 public:
  explicit LaneCommunicator(MPI_Comm base) { MPI_Comm_dup(base, &comm_); }
  std::string Describe() const override { return "MPI lane stand-in"; }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    if (Failing("allreduce")) return Injected("the communicator's allreduce");
    if (send != recv) std::memcpy(recv, send, count * hvdkeras::DataTypeSize(dtype));
    MPI_Datatype type = dtype == DataType::kFloat32 ? MPI_FLOAT : MPI_INT32_T;
    std::vector<MPI_Request> requests(1);
    MPI_Iallreduce(MPI_IN_PLACE, recv, static_cast<int>(count), type,
                   op == ReduceOp::kSum ? MPI_SUM : MPI_MAX, comm_, &requests[0]);
    return Complete(std::move(requests));
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    std::vector<MPI_Request> requests(1);
    MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &requests[0]);
    return Complete(std::move(requests));
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                       ReduceOp op) override {
    // Every block reduced in a copy kept for the communicator's life (its
    // request may be left "on the stream"), then this rank's block.
    int rank = 0, size = 1;
    MPI_Comm_rank(comm_, &rank);
    MPI_Comm_size(comm_, &size);
    const int64_t block = count * hvdkeras::DataTypeSize(dtype);
    kept_.emplace_back(static_cast<const char*>(send),
                       static_cast<const char*>(send) + block * size);
    Status s = Allreduce(kept_.back().data(), kept_.back().data(), count * size, dtype, op);
    if (s.ok()) std::memcpy(recv, kept_.back().data() + block * rank, block);
    return s;
  }
  Status Allgather(const void* send, void* recv, int64_t bytes) override {
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    const bool in_place = send == static_cast<char*>(recv) + bytes * rank;
    std::vector<MPI_Request> requests(1);
    MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(bytes), MPI_BYTE, recv,
                   static_cast<int>(bytes), MPI_BYTE, comm_, &requests[0]);
    return Complete(std::move(requests));
  }
  Status Exchange(const std::vector<DeviceSegment>& sends,
                  const std::vector<DeviceSegment>& recvs) override {
    std::vector<MPI_Request> requests;
    for (const DeviceSegment& s : sends) {
      requests.emplace_back();
      MPI_Isend(s.data, static_cast<int>(s.bytes), MPI_BYTE, s.rank, 7, comm_, &requests.back());
    }
    for (const DeviceSegment& r : recvs) {
      requests.emplace_back();
      MPI_Irecv(r.data, static_cast<int>(r.bytes), MPI_BYTE, r.rank, 7, comm_, &requests.back());
    }
    return Complete(std::move(requests));
  }
  Status AsyncError() override {
    return Failing("async") ? Injected("the communicator (a lost peer)") : Status::OK();
  }
  void Abort() override { Log("abort"); }

 private:
  Status Complete(std::vector<MPI_Request> requests) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    int done = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                  MPI_STATUSES_IGNORE);
      if (done) return Status::OK();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    Log("left on the stream");
    return Status::OK();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::deque<std::vector<char>> kept_;
};

const bool kRegistered = [] {
  hvdkeras::DeviceBackend backend;
  backend.name = "stand-in";
  backend.device = [](std::string*) -> hvdkeras::Device* { return &TheDevice(); };
  backend.new_unique_id = [](std::string* id) {
    *id = "stand-in id";
    return Status::OK();
  };
  backend.make_communicator = [](const std::string&, int, int, const DeviceLane& where, double,
                                 std::unique_ptr<hvdkeras::DeviceCommunicator>* out) {
    out->reset(new LaneCommunicator(LaneComms().at(where.lane)));
    return Status::OK();
  };
  hvdkeras::RegisterDeviceBackend(backend);
  return true;
}();

// A GPU tensor of float32 values (host memory here) and its completion.
struct Op {
  std::vector<float> input, output;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void* stream = nullptr;

  TensorRef Ref(int64_t n, float value, void* framework_stream, bool lazy = false) {
    input.assign(n, value);
    output.assign(n, -1.0f);
    stream = framework_stream;
    TensorRef ref;
    ref.dtype = DataType::kFloat32;
    ref.shape = {n};
    ref.input = input.data();
    ref.device = 0;
    ref.framework_stream = framework_stream;
    if (lazy) {
      ref.allocate_output = [this](const hvdkeras::Shape& s, void** data) {
        if (Failing("allocate")) return Injected("an output allocation");
        output.assign(hvdkeras::NumElements(s), -1.0f);
        *data = output.data();
        return Status::OK();
      };
    } else {
      ref.output = output.data();
    }
    return ref;
  }
  hvdkeras::DoneCallback Done(const std::string& name) {
    return [this, name](const Status& s) {
      Log("done " + name);
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      done = true;
      cv.notify_all();
    };
  }
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(60), [this] { return done; });
    return done ? status : Status::Error(StatusCode::kUnknown, "timed out");
  }
};

hvdkeras::EngineConfig Config() {
  hvdkeras::EngineConfig config;
  config.stall_shutdown_seconds = 30;
  return config;
}

void* FakeStream(int n) { return reinterpret_cast<void*>(static_cast<intptr_t>(0x1000 + n)); }

// Starts the global engine and process set 1, both over all ranks.
struct Engines {
  MPI_Comm global = MPI_COMM_NULL, set = MPI_COMM_NULL;
  Engines() {
    MPI_Comm_dup(MPI_COMM_WORLD, &global);
    MPI_Comm_dup(MPI_COMM_WORLD, &set);
    if (LaneComms().empty()) {
      MPI_Comm_dup(MPI_COMM_WORLD, &LaneComms()[0]);
      MPI_Comm_dup(MPI_COMM_WORLD, &LaneComms()[1]);
    }
    CHECK(hvdkeras::Engine::Instance().Start(global, Config()).ok());
    CHECK(hvdkeras::Engine::StartSet(1, set, Config()).ok());
  }
  ~Engines() {
    hvdkeras::Engine::StopSet(1);
    hvdkeras::Engine::Instance().Stop();
    MPI_Comm_free(&set);
    MPI_Comm_free(&global);
  }
};

int Size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

float RankSum() { return static_cast<float>(Size() * (Size() + 1) / 2); }

}  // namespace

TEST(TwoProcessSetsReduceAtOnceOnLanesOfTheirOwn) {
  Engines engines;
  constexpr int kSteps = 40;
  std::vector<std::unique_ptr<Op>> ops[2];
  std::vector<Status> queued[2];
  auto submit = [&](int set) {
    for (int i = 0; i < kSteps; ++i) {
      ops[set].push_back(std::make_unique<Op>());
      Op& op = *ops[set].back();
      const std::string name = "set" + std::to_string(set) + "." + std::to_string(i);
      // Two tensors per collective, so it takes the fused buffer.
      std::vector<TensorRef> refs{op.Ref(1000 + i, Rank() + 1.0f, FakeStream(set))};
      Op& twin = *(ops[set].emplace_back(std::make_unique<Op>()));
      refs.push_back(twin.Ref(7, Rank() + 1.0f, FakeStream(set)));
      queued[set].push_back(hvdkeras::EnqueueAllreduce(name, refs, ReduceOp::kSum, 1.0, 1.0,
                                                       set, op.Done(name)));
      op.Wait();
    }
  };
  std::thread a(submit, 0), b(submit, 1);
  a.join();
  b.join();
  for (int set = 0; set < 2; ++set) {
    for (const Status& s : queued[set]) CHECK(s.ok());
    for (size_t i = 0; i < ops[set].size(); i += 2) {
      CHECK(ops[set][i]->status.ok());
      CHECK_EQ(ops[set][i]->output.front(), RankSum());
      CHECK_EQ(ops[set][i]->output.back(), RankSum());
    }
  }
  CHECK(TheDevice().SharedBuffers().empty());
  CHECK(TheDevice().LanesOfSeveralThreads().empty());
  // Both sets' communicators are registered on GPU 0 (Note [process sets
  // sharing a GPU] in core/device.h): a third lane there sees both.
  const std::vector<int> others = hvdkeras::AddCommunicatorLane(0, 9);
  hvdkeras::RemoveCommunicatorLane(0, 9);
  CHECK_EQ(others.size(), static_cast<size_t>(2));
  // No rank stops its engines (which every rank's then follow, closing
  // their sessions) before every rank has looked.
  MPI_Barrier(MPI_COMM_WORLD);
}

namespace {

// Runs one fused allreduce of the global set with `failure` injected on
// every rank; checks it fails and that its stream was released first.
void FailsAfterQueueingAndReleasesFirst(const std::string& failure, bool gather) {
  Engines engines;
  SetFailing(failure, true);
  Op a, b;
  const std::string name = "fails." + failure;
  std::vector<TensorRef> refs{a.Ref(4096, 1.0f, FakeStream(7), gather),
                              b.Ref(5, 1.0f, FakeStream(7), gather)};
  Status queued = gather ? hvdkeras::EnqueueAllgather(name, refs, 0, a.Done(name))
                         : hvdkeras::EnqueueAllreduce(name, refs, ReduceOp::kSum, 1.0, 1.0, 0,
                                                      a.Done(name));
  CHECK(queued.ok());
  const Status s = a.Wait();
  SetFailing(failure, false);
  CHECK(!s.ok());
  CHECK(s.message.find("injected failure") != std::string::npos);
  const size_t released = Find("release " + StreamName(FakeStream(7)));
  const size_t done = Find("done " + name);
  CHECK(released != std::string::npos);
  CHECK(done != std::string::npos);
  CHECK(released < done);
}

}  // namespace

TEST(AFailedScratchGrowthReleasesTheStreamsBeforeDone) {
  FailsAfterQueueingAndReleasesFirst("scratch", false);
}

TEST(AFailedCommunicatorCallReleasesTheStreamsBeforeDone) {
  FailsAfterQueueingAndReleasesFirst("allreduce", false);
}

TEST(AFailedOutputAllocationReleasesTheStreamsBeforeDone) {
  FailsAfterQueueingAndReleasesFirst("allocate", true);
}

TEST(AnAllocationFailingOnOneRankLeavesNoRankWaiting) {
  // Note [a failed output allocation still takes part] in core/collectives.h,
  // on the GPU path (the stand-in device) and on the CPU one.
  Engines engines;
  const bool failing = Rank() == 0;
  SetFailing("allocate", failing);
  for (const int device : {0, -1}) {
    for (const std::string kind : {"gather", "alltoall", "reduce"}) {
      Op op;
      const std::string name = "one." + kind + "." + std::to_string(device);
      // GPU allreduce outputs exist when queued (a binding's contract);
      // everything else allocates its output once the shapes are agreed.
      const bool lazy = device < 0 || kind != "reduce";
      TensorRef ref = op.Ref(Size() * 3, Rank() + 1.0f, FakeStream(5), lazy);
      ref.device = device;
      Status queued;
      if (kind == "gather") {
        queued = hvdkeras::EnqueueAllgather(name, {ref}, 0, op.Done(name));
      } else if (kind == "alltoall") {
        queued = hvdkeras::EnqueueAlltoall(name, ref, std::vector<int64_t>(Size(), 3), 0,
                                           op.Done(name));
      } else {
        queued = hvdkeras::EnqueueAllreduce(name, {ref}, ReduceOp::kSum, 1.0, 1.0, 0,
                                            op.Done(name));
      }
      CHECK(queued.ok());
      const Status s = op.Wait();
      if (failing && lazy) {
        CHECK(!s.ok());
        CHECK(s.message.find("injected failure in an output allocation") != std::string::npos);
        continue;
      }
      CHECK(s.ok());
      if (kind == "reduce") {
        CHECK_EQ(op.output.size(), static_cast<size_t>(Size() * 3));
        for (float v : op.output) CHECK_EQ(v, RankSum());
        continue;
      }
      // Every rank r sent 3 rows of (r + 1) to each rank (alltoall), or all
      // of its rows (allgather): rank r's block holds r + 1.
      const size_t block = kind == "gather" ? static_cast<size_t>(Size() * 3) : 3;
      CHECK_EQ(op.output.size(), block * Size());
      for (size_t i = 0; i < op.output.size(); ++i) {
        CHECK_EQ(op.output[i], static_cast<float>(i / block + 1));
      }
    }
  }
  SetFailing("allocate", false);
}

TEST(ASetUpFailureOnOneRankFailsEveryRankThenRecovers) {
  Engines engines;
  const bool broken = Rank() == Size() - 1;
  SetFailing("prepare", broken);
  Op first;
  CHECK(hvdkeras::EnqueueAllreduce("setup.first", {first.Ref(8, 1.0f, FakeStream(1))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, first.Done("setup.first"))
            .ok());
  const Status s = first.Wait();
  SetFailing("prepare", false);
  CHECK(!s.ok());
  // Every rank names the broken rank and its reason.
  CHECK(s.message.find("on rank " + std::to_string(Size() - 1) + ", injected failure in prepare") !=
        std::string::npos);
  Op second;
  CHECK(hvdkeras::EnqueueAllreduce("setup.second", {second.Ref(8, Rank() + 1.0f, FakeStream(1))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, second.Done("setup.second"))
            .ok());
  CHECK(second.Wait().ok());
  CHECK_EQ(second.output[0], RankSum());
}

TEST(AFirstBatchMixingGpusOnOneRankIsRefusedOnEveryRank) {
  // Note [GPU checks are agreed] in core/device_session.h: the last rank's
  // first GPU batch holds tensors on two GPUs; every rank still takes part
  // in the set-up exchange and refuses the batch, naming that rank.
  Engines engines;
  const bool mixing = Rank() == Size() - 1;
  Op a, b;
  TensorRef second = b.Ref(5, 1.0f, FakeStream(14));
  if (mixing) second.device = 1;
  CHECK(hvdkeras::EnqueueAllreduce("mixed.first", {a.Ref(8, 1.0f, FakeStream(14)), second},
                                   ReduceOp::kSum, 1.0, 1.0, 0, a.Done("mixed.first"))
            .ok());
  const Status s = a.Wait();
  CHECK(!s.ok());
  CHECK(s.message.find("on rank " + std::to_string(Size() - 1) +
                       ", collective 'mixed.first' mixes GPUs 0 and 1") != std::string::npos);
  // Nothing was made: the next batch, on one GPU everywhere, sets up and works.
  Op next;
  CHECK(hvdkeras::EnqueueAllreduce("mixed.next", {next.Ref(8, Rank() + 1.0f, FakeStream(14))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, next.Done("mixed.next"))
            .ok());
  CHECK(next.Wait().ok());
  CHECK_EQ(next.output[0], RankSum());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(ARankThatMovesToAnotherGpuEndsEveryRankWithTheReason) {
  // After set-up, the last rank's batch is on GPU 1 while the others make
  // their communicator call for it: the failure path ends every rank's
  // engine, naming the rank, instead of leaving its calls one behind.
  Engines engines;
  const bool moving = Rank() == Size() - 1;
  Op warm;
  CHECK(hvdkeras::EnqueueAllreduce("moved.warm", {warm.Ref(8, 1.0f, FakeStream(15))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, warm.Done("moved.warm"))
            .ok());
  CHECK(warm.Wait().ok());
  Op waiting;
  const std::string alone = "moved.alone." + std::to_string(Rank());
  CHECK(hvdkeras::EnqueueAllreduce(alone, {waiting.Ref(8, 1.0f, FakeStream(15))}, ReduceOp::kSum,
                                   1.0, 1.0, 0, waiting.Done(alone))
            .ok());
  Op moved;
  TensorRef ref = moved.Ref(8, 1.0f, FakeStream(15));
  if (moving) ref.device = 1;
  CHECK(hvdkeras::EnqueueAllreduce("moved.step", {ref}, ReduceOp::kSum, 1.0, 1.0, 0,
                                   moved.Done("moved.step"))
            .ok());
  const Status step = moved.Wait();
  if (moving) {
    CHECK(!step.ok());
    CHECK(step.message.find("used GPU 0 and now GPU 1") != std::string::npos);
  }
  const Status s = waiting.Wait();
  CHECK(!s.ok());
  CHECK(s.message.find("a GPU collective failed on rank " + std::to_string(Size() - 1)) !=
        std::string::npos);
  CHECK(s.message.find("used GPU 0 and now GPU 1") != std::string::npos);
  for (int i = 0; i < 300 && hvdkeras::Engine::Instance().running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(!hvdkeras::Engine::Instance().running());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(AnAsyncCommunicatorErrorEndsTheEngine) {
  Engines engines;
  Op warm;
  CHECK(hvdkeras::EnqueueAllreduce("async.warm", {warm.Ref(8, 1.0f, FakeStream(2))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, warm.Done("async.warm"))
            .ok());
  CHECK(warm.Wait().ok());
  // An op submitted by rank 0 alone waits for the others; then every
  // rank's communicator learns of an error: the op fails with it.
  Op waiting;
  if (Rank() == 0) {
    CHECK(hvdkeras::EnqueueAllreduce("async.waiting", {waiting.Ref(8, 1.0f, FakeStream(2))},
                                     ReduceOp::kSum, 1.0, 1.0, 0, waiting.Done("async.waiting"))
              .ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  SetFailing("async", true);
  if (Rank() == 0) {
    const Status s = waiting.Wait();
    CHECK(!s.ok());
    CHECK(s.message.find("the GPU communicator failed") != std::string::npos);
  }
  // The engine stopped: nothing more is accepted.
  for (int i = 0; i < 200 && hvdkeras::Engine::Instance().running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(!hvdkeras::Engine::Instance().running());
  CHECK(Find("abort") != std::string::npos);
  SetFailing("async", false);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(AJoinedRanksFirstGpuBatchUsesItsPinnedGpu) {
  Engines engines;
  hvdkeras::SetPinnedDevice(1);
  const bool joins = Rank() == Size() - 1;
  int32_t last = -1;
  Op join, op;
  if (joins) {
    CHECK(hvdkeras::EnqueueJoin("hvdkeras.join", &last, join.Done("join")).ok());
  } else {
    TensorRef ref = op.Ref(8, 1.0f, FakeStream(3));
    ref.device = 1;
    CHECK(hvdkeras::EnqueueAllreduce("joined.step", {ref}, ReduceOp::kSum, 1.0, 1.0, 0,
                                     op.Done("joined.step"))
              .ok());
    CHECK(op.Wait().ok());
    CHECK_EQ(op.output[0], static_cast<float>(Size() - 1));
    CHECK(hvdkeras::EnqueueJoin("hvdkeras.join", &last, join.Done("join")).ok());
  }
  CHECK(join.Wait().ok());
  hvdkeras::SetPinnedDevice(-1);
  // Every rank (the joined one through its stand-ins) prepared GPU 1's lane.
  CHECK(Find("prepare 1 0") != std::string::npos);
  CHECK(TheDevice().DevicesUsed().count(1) == 1);
}

TEST(AGpuBatchFailingOnOneRankEndsEveryRankWithTheReason) {
  // Note [a failed GPU batch ends every rank] in core/device_session.h: the
  // last rank's fused batch fails at scratch growth, before its
  // communicator call, while the others make theirs.
  Engines engines;
  const bool failing = Rank() == Size() - 1;
  Op warm;
  CHECK(hvdkeras::EnqueueAllreduce("batch.warm", {warm.Ref(8, 1.0f, FakeStream(4))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, warm.Done("batch.warm"))
            .ok());
  CHECK(warm.Wait().ok());
  // A collective of this rank alone stays pending until the engine ends.
  Op waiting;
  const std::string alone = "batch.alone." + std::to_string(Rank());
  CHECK(hvdkeras::EnqueueAllreduce(alone, {waiting.Ref(8, 1.0f, FakeStream(4))}, ReduceOp::kSum,
                                   1.0, 1.0, 0, waiting.Done(alone))
            .ok());
  ClearLog();
  SetFailing("scratch", failing);
  Op a, b;
  CHECK(hvdkeras::EnqueueAllreduce("batch.fused",
                                   {a.Ref(1 << 16, 1.0f, FakeStream(4)),
                                    b.Ref(3, 1.0f, FakeStream(4))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, a.Done("batch.fused"))
            .ok());
  const Status fused = a.Wait();
  SetFailing("scratch", false);
  if (failing) {
    CHECK(!fused.ok());
    CHECK(fused.message.find("injected failure in scratch growth") != std::string::npos);
    // The failed rank drained its lane and left its communicator to the
    // agreed stop: the others are still in their call (3 s here), so no
    // abort can have come from that stop yet.
    CHECK(Find("synchronize") != std::string::npos);
    CHECK(Find("abort") == std::string::npos);
  }
  const Status s = waiting.Wait();
  CHECK(!s.ok());
  const std::string culprit = "a GPU collective failed on rank " + std::to_string(Size() - 1);
  CHECK(s.message.find(culprit) != std::string::npos);
  CHECK(s.message.find("'batch.fused'") != std::string::npos);
  CHECK(s.message.find("injected failure in scratch growth") != std::string::npos);
  // Every rank aborts as its engine closes, just after the error reached
  // the waiting ops.
  for (int i = 0; i < 300 && (hvdkeras::Engine::Instance().running() ||
                              Find("abort") == std::string::npos);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(!hvdkeras::Engine::Instance().running());
  CHECK(Find("abort") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(AStandInOnlyBatchUsesTheGpuTheProcessUsedWithoutPinning) {
  // Ranks pinned by their framework alone (no pin_gpu()): an engine whose
  // first GPU batch holds only a joined rank's stand-ins takes the GPU this
  // process queued its tensors on (here in process set 1), not GPU 0.
  Engines engines;
  ClearLog();
  const bool joins = Rank() == Size() - 1;
  Op first;
  TensorRef ref = first.Ref(8, 1.0f, FakeStream(6));
  ref.device = 1;
  CHECK(hvdkeras::EnqueueAllreduce("unpinned.set", {ref}, ReduceOp::kSum, 1.0, 1.0, 1,
                                   first.Done("unpinned.set"))
            .ok());
  CHECK(first.Wait().ok());
  int32_t last = -1;
  Op join, op;
  if (joins) {
    CHECK(hvdkeras::EnqueueJoin("hvdkeras.join", &last, join.Done("join")).ok());
  } else {
    TensorRef global = op.Ref(8, 1.0f, FakeStream(6));
    global.device = 1;
    CHECK(hvdkeras::EnqueueAllreduce("unpinned.global", {global}, ReduceOp::kSum, 1.0, 1.0, 0,
                                     op.Done("unpinned.global"))
              .ok());
    CHECK(op.Wait().ok());
    CHECK(hvdkeras::EnqueueJoin("hvdkeras.join", &last, join.Done("join")).ok());
  }
  CHECK(join.Wait().ok());
  CHECK(Find("prepare 1 0") != std::string::npos);
  CHECK(Find("prepare 0 0") == std::string::npos);
}

TEST(AGpuReducescatterOutputIsAllocatedWhenQueued) {
  // Its rows are known when it is queued, so it is allocated then, on the
  // framework's thread, and the engine does not wait for the framework's
  // stream before writing it.
  Engines engines;
  ClearLog();
  Op op;
  const int64_t rows = 2 * Size() + 1;
  TensorRef ref = op.Ref(rows, Rank() + 1.0f, FakeStream(8), /*lazy=*/true);
  std::thread::id allocated_on;
  hvdkeras::AllocateOutput lazy = ref.allocate_output;
  ref.allocate_output = [&](const hvdkeras::Shape& shape, void** data) {
    allocated_on = std::this_thread::get_id();
    return lazy(shape, data);
  };
  CHECK(hvdkeras::EnqueueReducescatter("scatter.gpu", {ref}, ReduceOp::kSum, 1.0, 1.0, 0,
                                       op.Done("scatter.gpu"))
            .ok());
  CHECK(allocated_on == std::this_thread::get_id());
  CHECK(op.Wait().ok());
  CHECK_EQ(op.output.size(), static_cast<size_t>(hvdkeras::ScatterRows(rows, Size(), Rank())));
  for (float v : op.output) CHECK_EQ(v, RankSum());
  CHECK(Find("wait " + StreamName(FakeStream(8))) == std::string::npos);
}

extern "C" {
int64_t hvdkeras_request_submit(int kind_number, const char* name, int count,
                                const void* const* inputs, void* const* outputs,
                                const int* ranks, const int64_t* dims, int dtype,
                                int reduce_op, double prescale, double postscale, int root,
                                const int64_t* splits, int count_splits, int process_set,
                                int device, void* stream, char* error, int capacity);
int hvdkeras_request_wait(int64_t id, double timeout_seconds, char* error, int capacity);
void hvdkeras_request_release(int64_t id);
}

TEST(TheCApiTakesGpuTensorsWithTheirStream) {
  // What the torch binding hands over for CUDA tensors: the device and
  // torch's current stream, which the engine waits for and releases.
  Engines engines;
  ClearLog();
  std::vector<float> data(16, Rank() + 1.0f);
  const void* inputs[] = {data.data()};
  void* outputs[] = {data.data()};
  const int ranks[] = {1};
  const int64_t dims[] = {16};
  char error[256] = {0};
  const int64_t id = hvdkeras_request_submit(
      static_cast<int>(hvdkeras::OpType::kAllreduce), "capi.gpu", 1, inputs, outputs, ranks,
      dims, static_cast<int>(DataType::kFloat32), static_cast<int>(ReduceOp::kSum), 1.0, 1.0, 0,
      nullptr, 0, 0, /*device=*/0, FakeStream(10), error, sizeof(error));
  CHECK(id > 0);
  CHECK_EQ(hvdkeras_request_wait(id, 60.0, error, sizeof(error)), 0);
  hvdkeras_request_release(id);
  for (float v : data) CHECK_EQ(v, RankSum());
  CHECK(Find("release " + StreamName(FakeStream(10))) != std::string::npos);
  // torch's default stream is CUDA's legacy stream, handed over as null: it
  // is waited for and released like any other.
  std::vector<float> more(16, 1.0f);
  const void* more_in[] = {more.data()};
  void* more_out[] = {more.data()};
  const int64_t on_default = hvdkeras_request_submit(
      static_cast<int>(hvdkeras::OpType::kAllreduce), "capi.default", 1, more_in, more_out, ranks,
      dims, static_cast<int>(DataType::kFloat32), static_cast<int>(ReduceOp::kSum), 1.0, 1.0, 0,
      nullptr, 0, 0, /*device=*/0, nullptr, error, sizeof(error));
  CHECK(on_default > 0);
  CHECK_EQ(hvdkeras_request_wait(on_default, 60.0, error, sizeof(error)), 0);
  hvdkeras_request_release(on_default);
  for (float v : more) CHECK_EQ(v, static_cast<float>(Size()));
  CHECK(Find("release " + StreamName(nullptr)) != std::string::npos);
  // A GPU allgather into an output the caller allocated (every rank's 16
  // rows, agreed beforehand).
  std::vector<float> gathered(16 * Size(), -1.0f);
  void* gathered_out[] = {gathered.data()};
  const int64_t gather = hvdkeras_request_submit(
      static_cast<int>(hvdkeras::OpType::kAllgather), "capi.gather", 1, inputs, gathered_out,
      ranks, dims, static_cast<int>(DataType::kFloat32), 0, 1.0, 1.0, 0, nullptr, 0, 0, 0,
      FakeStream(10), error, sizeof(error));
  CHECK(gather > 0);
  CHECK_EQ(hvdkeras_request_wait(gather, 60.0, error, sizeof(error)), 0);
  hvdkeras_request_release(gather);
  for (float v : gathered) CHECK_EQ(v, RankSum());  // each rank's rows hold the reduced sum
  // Alltoall, whose outputs the engine allocates in host memory, refuses
  // GPU tensors with the reason.
  const int64_t splits[] = {16};
  const int64_t refused = hvdkeras_request_submit(
      static_cast<int>(hvdkeras::OpType::kAlltoall), "capi.alltoall", 1, inputs, outputs, ranks,
      dims, static_cast<int>(DataType::kFloat32), 0, 1.0, 1.0, 0, splits, 1, 0, 0,
      FakeStream(10), error, sizeof(error));
  CHECK_EQ(refused, static_cast<int64_t>(0));
  CHECK(std::string(error).find("takes host tensors through this binding") != std::string::npos);
}

TEST(TheTimelineShowsGpuBatchesAsTheDeviceRanThem) {
  // Note [device time] in core/device.h: while tracing, a GPU batch gets a
  // span on its op's GPU row, from marks on the lane.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  hvdkeras::EngineConfig config = Config();
  const std::string path = "/tmp/hvdkeras_device_timeline_" + std::to_string(getpid()) + ".json";
  config.timeline_path = path;
  CHECK(hvdkeras::Engine::Instance().Start(comm, config).ok());
  Op a, b;
  CHECK(hvdkeras::EnqueueAllreduce("traced.gpu", {a.Ref(64, 1.0f, FakeStream(11)),
                                                  b.Ref(5, 1.0f, FakeStream(11))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, a.Done("traced.gpu"))
            .ok());
  CHECK(a.Wait().ok());
  // Spans are collected at the start of a later cycle: one more op.
  Op c;
  CHECK(hvdkeras::EnqueueAllreduce("traced.after", {c.Ref(8, 1.0f, FakeStream(11))},
                                   ReduceOp::kSum, 1.0, 1.0, 0, c.Done("traced.after"))
            .ok());
  CHECK(c.Wait().ok());
  hvdkeras::Engine::Instance().Stop();
  MPI_Comm_free(&comm);
  if (Rank() == 0) {
    FILE* f = std::fopen(path.c_str(), "r");
    CHECK(f != nullptr);
    std::string text;
    char chunk[4096];
    size_t got = 0;
    while (f != nullptr && (got = std::fread(chunk, 1, sizeof(chunk), f)) > 0) text.append(chunk, got);
    if (f != nullptr) std::fclose(f);
    std::remove(path.c_str());
    CHECK(text.find("\"ph\":\"X\"") != std::string::npos);
    CHECK(text.find("\"tid\":2") != std::string::npos);
    CHECK(text.find("\"name\":\"GPU_ALLREDUCE\"") != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

size_t Count(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  size_t n = 0;
  for (const std::string& l : g_log) n += l == line ? 1 : 0;
  return n;
}

TEST(OneReadyEventPerStreamAndARemovedSetsLaneIsFreed) {
  // Three tensors on one framework stream and one on another: two ready
  // events, not four. A stopped set's lane gives back its stream and
  // scratch memory.
  ClearLog();
  {
    Engines engines;
    Op a, b, c, d;
    CHECK(hvdkeras::EnqueueAllreduce("events.per.stream",
                                     {a.Ref(8, 1.0f, FakeStream(12)), b.Ref(9, 1.0f, FakeStream(12)),
                                      c.Ref(10, 1.0f, FakeStream(12)),
                                      d.Ref(11, 1.0f, FakeStream(13))},
                                     ReduceOp::kSum, 1.0, 1.0, 1, a.Done("events.per.stream"))
              .ok());
    CHECK(a.Wait().ok());
    CHECK_EQ(Count("ready " + StreamName(FakeStream(12))), static_cast<size_t>(1));
    CHECK_EQ(Count("ready " + StreamName(FakeStream(13))), static_cast<size_t>(1));
  }
  CHECK(Find("release lane 1") != std::string::npos);
}

TEST(ANegotiationEndedByADeviceErrorKeepsItsBufferForTheLateRanks) {
  // Rank 0's wait for the status bits ends at once on a device error while
  // the other ranks are still on their way; they send their bits later.
  // See Note [an abandoned negotiation keeps its buffer] in negotiation_wait.cc.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  hvdkeras::MpiContext mpi;
  CHECK(mpi.Open(comm).ok());
  hvdkeras::MpiNegotiationTransport transport(&mpi);
  hvdkeras::Negotiator negotiator;
  negotiator.Reset(&transport, Config());
  const hvdkeras::PendingOps none;
  hvdkeras::CycleSignals healthy, broken;
  broken.health = [] { return Injected("the communicator"); };
  constexpr uint64_t kPattern = 0x0123456789abcdefULL;
  std::vector<std::vector<uint64_t>> probes;
  if (Rank() == 0) {
    CHECK(!negotiator.Negotiate(none, broken, std::chrono::steady_clock::now()).error.ok());
    // Fresh allocations of every small size: had the buffer been freed, one
    // of them takes its memory and the late bits land in it.
    for (size_t words = 1; words <= 64; ++words) {
      for (int copy = 0; copy < 4; ++copy) probes.emplace_back(words, kPattern);
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(negotiator.Negotiate(none, healthy, std::chrono::steady_clock::now()).error.ok());
  }
  MPI_Barrier(comm);  // rank 0's MPI progress completes the abandoned reduction
  for (const std::vector<uint64_t>& probe : probes) {
    for (uint64_t word : probe) CHECK_EQ(word, kPattern);
  }
  // The communicator stays consistent: a next round works on every rank.
  CHECK(negotiator.Negotiate(none, healthy, std::chrono::steady_clock::now()).error.ok());
  mpi.Close();
  MPI_Comm_free(&comm);
}

// The GPU execution of every collective (core/collective_device_*.cc), run on
// real MPI ranks with STAND-INS for the GPU: HostDevice keeps "device"
// memory on the host and does its copies, scaling and fills with the CPU
// path's functions; HostCommunicator moves host bytes over MPI. No GPU can
// run here, so these stand-ins are limited to what the engine asks of a
// device; what they check is the engine's own logic: where each tensor
// goes in the fused buffer, which copies are made and scaled, neutral
// contributions of joined ranks, the root's outputs in a broadcast, the
// rows of gathers and scatters, and that every framework stream is waited
// for before new outputs are written and released at the end (Note [stream
// order] in core/device.h). Driven by tests/test_device_collectives.py
// under mpiexec with 2 and 3 ranks.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/collectives.h"
#include "core/half.h"
#include "core/scaling.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::DeviceCopy;
using hvdkeras::DeviceSegment;
using hvdkeras::ReduceOp;
using hvdkeras::Status;

// MPI for the whole binary: started before main() runs the tests.
struct MpiSession {
  MpiSession() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  ~MpiSession() { MPI_Finalize(); }
} g_mpi;

// What the engine asked of the device, in order, for the stream-order checks.
std::vector<std::string> g_log;

class HostDevice : public hvdkeras::Device {
 public:
  std::string Describe() const override { return "host stand-in"; }
  int DeviceCount() const override { return 1; }
  std::string Identity(int) const override { return "stand-in"; }
  Status PointerDevice(const void*, int* device) const override {
    *device = 0;
    return Status::OK();
  }
  Status RecordReady(int, void*, void** event) override {
    *event = nullptr;
    return Status::OK();
  }
  void Discard(void*) override {}
  Status Prepare(const hvdkeras::DeviceLane&) override { return Status::OK(); }
  Status WaitFor(const hvdkeras::DeviceLane&, void*) override { return Status::OK(); }
  Status Synchronize(const hvdkeras::DeviceLane&) override {
    g_log.push_back("synchronize");
    return Status::OK();
  }
  Status WaitForStream(const hvdkeras::DeviceLane&, void* stream) override {
    g_log.push_back("wait " + Name(stream));
    return Status::OK();
  }
  Status Release(const hvdkeras::DeviceLane&, void* stream) override {
    g_log.push_back("release " + Name(stream));
    return Status::OK();
  }
  Status Scratch(const hvdkeras::DeviceLane&, int slot, int64_t bytes, void** data) override {
    std::vector<char>& buffer = scratch_[slot];
    // Garbage, as fresh device memory would hold: nothing may rely on zeros.
    if (static_cast<int64_t>(buffer.size()) < bytes) buffer.assign(bytes, '\x5a');
    *data = buffer.data();
    return Status::OK();
  }
  Status CopyScaled(const hvdkeras::DeviceLane&, DataType dtype,
                    const std::vector<DeviceCopy>& copies, double factor) override {
    g_log.push_back("copy");
    for (const DeviceCopy& c : copies) hvdkeras::ScaleCopy(dtype, c.src, c.dst, c.count, factor);
    return Status::OK();
  }
  Status CopyFinalized(const hvdkeras::DeviceLane&, DataType dtype,
                       const std::vector<DeviceCopy>& copies, int divisor,
                       double factor) override {
    g_log.push_back("copy");
    for (const DeviceCopy& c : copies) {
      hvdkeras::FinalizeCopy(dtype, c.src, c.dst, c.count, divisor, factor);
    }
    return Status::OK();
  }
  Status FillNeutral(const hvdkeras::DeviceLane&, DataType dtype, ReduceOp op, void* data,
                     int64_t count) override {
    hvdkeras::FillNeutral(dtype, op, data, count);
    return Status::OK();
  }
  Status Zero(const hvdkeras::DeviceLane&, void* data, int64_t bytes) override {
    std::memset(data, 0, bytes);
    return Status::OK();
  }
  void ReleaseLane(int) override {}
  Status MarkTime(const hvdkeras::DeviceLane&, void** mark) override {
    *mark = nullptr;
    return Status::Error(hvdkeras::StatusCode::kUnknown, "the stand-in keeps no time");
  }
  Status MarkedTime(void*, bool* reached, std::chrono::steady_clock::time_point*) override {
    *reached = false;
    return Status::OK();
  }
  void ReleaseMark(void*) override {}

  static std::string Name(void* stream) { return std::to_string(reinterpret_cast<intptr_t>(stream)); }

 private:
  std::map<int, std::vector<char>> scratch_;
};

class HostCommunicator : public hvdkeras::DeviceCommunicator {
 public:
  explicit HostCommunicator(const hvdkeras::MpiContext& mpi) : mpi_(mpi) {}
  std::string Describe() const override { return "MPI stand-in"; }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    g_log.push_back("allreduce");
    // Average arrives as Sum, as NCCL gets it (the engine divides after).
    CHECK(op != ReduceOp::kAverage);
    if (send != recv) std::memcpy(recv, send, count * hvdkeras::DataTypeSize(dtype));
    return mpi_.Allreduce(nullptr, recv, count, dtype, op);
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    g_log.push_back("broadcast");
    return mpi_.Broadcast(data, bytes, root);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count, DataType dtype,
                       ReduceOp op) override {
    g_log.push_back("reducescatter");
    CHECK(op != ReduceOp::kAverage);
    // The stand-in reduces every block and keeps this rank's.
    const int64_t block = count * hvdkeras::DataTypeSize(dtype);
    std::vector<char> whole(static_cast<const char*>(send),
                            static_cast<const char*>(send) + block * mpi_.size());
    Status s = mpi_.Allreduce(nullptr, whole.data(), count * mpi_.size(), dtype, op);
    if (s.ok()) std::memcpy(recv, whole.data() + block * mpi_.rank(), block);
    return s;
  }
  Status Allgather(const void* send, void* recv, int64_t bytes) override {
    g_log.push_back("allgather");
    const bool in_place = send == static_cast<char*>(recv) + bytes * mpi_.rank();
    MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(bytes), MPI_BYTE, recv,
                  static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD);
    return Status::OK();
  }
  Status Exchange(const std::vector<DeviceSegment>& sends,
                  const std::vector<DeviceSegment>& recvs) override {
    g_log.push_back("exchange");
    std::vector<MPI_Request> requests;
    for (const DeviceSegment& s : sends) {
      requests.emplace_back();
      MPI_Isend(s.data, static_cast<int>(s.bytes), MPI_BYTE, s.rank, 7, MPI_COMM_WORLD,
                &requests.back());
    }
    for (const DeviceSegment& r : recvs) {
      requests.emplace_back();
      MPI_Irecv(r.data, static_cast<int>(r.bytes), MPI_BYTE, r.rank, 7, MPI_COMM_WORLD,
                &requests.back());
    }
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    return Status::OK();
  }
  Status AsyncError() override { return Status::OK(); }
  void Abort() override {}

 private:
  const hvdkeras::MpiContext& mpi_;
};

// One world for every test.
struct World {
  hvdkeras::MpiContext mpi;
  hvdkeras::FusionBuffer buffer;
  hvdkeras::BlockPool blocks{1 << 20};
  HostDevice device;
  std::unique_ptr<HostCommunicator> comm;
  World() {
    mpi.Open(MPI_COMM_WORLD);
    comm = std::make_unique<HostCommunicator>(mpi);
  }
  hvdkeras::ExecContext Context() {
    hvdkeras::ExecContext ctx{mpi, buffer, nullptr, &blocks, nullptr};
    ctx.device = &device;
    ctx.device_comm = comm.get();
    ctx.device_lane = {0, 0};
    return ctx;
  }
  int rank() const { return mpi.rank(); }
  int size() const { return mpi.size(); }
};

World& W() {
  static World world;
  return world;
}

// A tensor's "device" memory (host vectors here) and its engine view.
struct Tensor {
  std::vector<char> input, output;
  hvdkeras::TensorRef ref;
};

template <typename T>
std::unique_ptr<Tensor> MakeTensor(const std::vector<T>& values, hvdkeras::Shape shape,
                                   DataType dtype, bool in_place, void* stream,
                                   bool lazy_output = false) {
  auto t = std::make_unique<Tensor>();
  t->input.resize(values.size() * sizeof(T));
  std::memcpy(t->input.data(), values.data(), t->input.size());
  t->ref.input = t->input.data();
  t->ref.dtype = dtype;
  t->ref.shape = std::move(shape);
  t->ref.device = 0;
  t->ref.framework_stream = stream;
  Tensor* raw = t.get();
  if (lazy_output) {
    t->ref.allocate_output = [raw](const hvdkeras::Shape& s, void** data) {
      int64_t n = hvdkeras::NumElements(s) * hvdkeras::DataTypeSize(raw->ref.dtype);
      raw->output.assign(std::max<int64_t>(n, 1), '\x11');
      g_log.push_back("alloc");
      *data = raw->output.data();
      return Status::OK();
    };
  } else if (in_place) {
    t->ref.output = t->input.data();
  } else {
    t->output.assign(t->input.size(), '\x22');
    t->ref.output = t->output.data();
  }
  return t;
}

template <typename T>
std::vector<T> Values(const Tensor& t, bool in_place) {
  const std::vector<char>& bytes = in_place ? t.input : t.output;
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

hvdkeras::PendingOp MakeOp(hvdkeras::OpType type, std::vector<Tensor*> tensors,
                           ReduceOp op = ReduceOp::kSum, double pre = 1.0, double post = 1.0) {
  hvdkeras::PendingOp p;
  p.request.name = "t";
  p.request.op_type = type;
  p.request.reduce_op = op;
  p.request.prescale = pre;
  p.request.postscale = post;
  p.request.device = hvdkeras::DeviceKind::kGpu;
  for (Tensor* t : tensors) {
    p.tensors.push_back(t->ref);
    p.request.dtypes.push_back(t->ref.dtype);
    p.request.shapes.push_back(t->ref.shape);
  }
  p.response = std::make_shared<hvdkeras::Response>();
  return p;
}

// Every framework stream of the batch was released after the last collective.
void CheckReleased(const std::vector<void*>& streams) {
  for (void* s : streams) {
    auto it = std::find(g_log.begin(), g_log.end(), "release " + HostDevice::Name(s));
    CHECK(it != g_log.end());
  }
  CHECK(g_log.back().rfind("release", 0) == 0);
}

}  // namespace

namespace {

using hvdkeras::OpType;

// Small integers: sums over ranks are exact in every type used here.
float Contribution(int64_t j, int i, int rank) { return static_cast<float>((j + i + rank) % 5); }

TEST(FusedAllreduceOverOddSizesScalesAndAverages) {
  World& w = W();
  g_log.clear();
  const std::vector<int64_t> counts = {1, 3, 64, 65, 257, 0, 1000};
  std::vector<std::unique_ptr<Tensor>> tensors;
  std::vector<Tensor*> raw;
  for (size_t i = 0; i < counts.size(); ++i) {
    std::vector<float> values(counts[i]);
    for (int64_t j = 0; j < counts[i]; ++j) values[j] = Contribution(j, i, w.rank());
    // Alternate in-place and separate outputs, and two framework streams.
    tensors.push_back(MakeTensor(values, {counts[i]}, DataType::kFloat32, i % 2 == 0,
                                 reinterpret_cast<void*>(101 + i % 2)));
    raw.push_back(tensors.back().get());
  }
  hvdkeras::PendingOp op = MakeOp(OpType::kAllreduce, raw, ReduceOp::kAverage, 2.0, 0.5);
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&op}).ok());
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::vector<float> got = Values<float>(*tensors[i], i % 2 == 0);
    for (int64_t j = 0; j < counts[i]; ++j) {
      float sum = 0;
      for (int r = 0; r < w.size(); ++r) sum += 2.0f * Contribution(j, i, r);
      const float expected = static_cast<float>(static_cast<double>(sum) / w.size() * 0.5);
      if (got[j] != expected) {
        CHECK_EQ(got[j], expected);
        break;
      }
    }
  }
  CheckReleased({reinterpret_cast<void*>(101), reinterpret_cast<void*>(102)});
  // The average and the postscale ride on the unpack: after the reduction
  // the fused buffer is read once, by one batch of copies.
  const auto reduced = std::find(g_log.begin(), g_log.end(), "allreduce");
  CHECK(reduced != g_log.end());
  CHECK_EQ(static_cast<int>(std::count(reduced, g_log.end(), std::string("copy"))), 1);
}

TEST(FusedAllreduceOfIntegersAndHalves) {
  World& w = W();
  std::vector<int32_t> ints = {7, -7, 9, 100};
  for (int32_t& v : ints) v += w.rank();
  std::vector<uint16_t> halves;
  for (int j = 0; j < 5; ++j) halves.push_back(hvdkeras::FloatToHalf(0.5f * (j + w.rank())));
  auto a = MakeTensor(ints, {4}, DataType::kInt32, false, reinterpret_cast<void*>(1));
  auto b = MakeTensor(halves, {5}, DataType::kFloat16, true, reinterpret_cast<void*>(1));
  hvdkeras::PendingOp ia = MakeOp(OpType::kAllreduce, {a.get()}, ReduceOp::kAverage);
  hvdkeras::PendingOp hb = MakeOp(OpType::kAllreduce, {b.get()}, ReduceOp::kMax);
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&ia}).ok());
  CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&hb}).ok());
  std::vector<int32_t> expected;
  for (int32_t base : {7, -7, 9, 100}) {
    int32_t total = 0;
    for (int r = 0; r < w.size(); ++r) total += base + r;
    expected.push_back(total / w.size());  // toward zero, as the CPU path
  }
  CHECK_EQ(Values<int32_t>(*a, false), expected);
  std::vector<uint16_t> max_halves;
  for (int j = 0; j < 5; ++j) max_halves.push_back(hvdkeras::FloatToHalf(0.5f * (j + w.size() - 1)));
  CHECK_EQ(Values<uint16_t>(*b, true), max_halves);
}

TEST(LoneTensorWithPrescaleInPlaceAndNot) {
  World& w = W();
  for (bool in_place : {true, false}) {
    std::vector<float> values = {1, 2, 3};
    for (float& v : values) v *= w.rank() + 1;
    auto t = MakeTensor(values, {3}, DataType::kFloat32, in_place, reinterpret_cast<void*>(5));
    hvdkeras::PendingOp op = MakeOp(OpType::kAllreduce, {t.get()}, ReduceOp::kSum, 3.0);
    hvdkeras::ExecContext ctx = w.Context();
    g_log.clear();
    CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&op}).ok());
    const float ranks = w.size() * (w.size() + 1) / 2.0f;
    CHECK_EQ(Values<float>(*t, in_place), (std::vector<float>{3 * ranks, 6 * ranks, 9 * ranks}));
    CheckReleased({reinterpret_cast<void*>(5)});
  }
}

TEST(JoinedRankContributesTheNeutralElement) {
  World& w = W();
  const bool joined = w.rank() == w.size() - 1;
  std::vector<int32_t> values = {10 + w.rank(), -3 - w.rank(), 50};
  auto t = MakeTensor(values, {3}, DataType::kInt32, false, reinterpret_cast<void*>(9));
  if (joined) {  // a stand-in, as Negotiator::StandIn builds it: no stream, no output
    t->ref.neutral = true;
    t->ref.framework_stream = nullptr;
    t->ref.device = -1;
  }
  hvdkeras::PendingOp op = MakeOp(OpType::kAllreduce, {t.get()}, ReduceOp::kMin);
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&op}).ok());
  if (!joined) {
    const int last = w.size() - 2;  // the last rank that did not join
    CHECK_EQ(Values<int32_t>(*t, false), (std::vector<int32_t>{10, -3 - last, 50}));
  }
}

// A joined rank's stand-in: host input, no stream, nothing to write back.
void MakeStandIn(Tensor* t) {
  t->ref.neutral = true;
  t->ref.framework_stream = nullptr;
  t->ref.device = -1;
}

TEST(JoinedRankTakesPartInFusedAllreducesAndBroadcasts) {
  World& w = W();
  const bool joined = w.rank() == w.size() - 1 && w.size() > 1;
  for (int count : {1, 3}) {
    std::vector<std::unique_ptr<Tensor>> sums, copies;
    std::vector<Tensor*> sum_raw, copy_raw;
    for (int i = 0; i < count; ++i) {
      std::vector<float> values(4 + 70 * i, static_cast<float>(w.rank() + 1));
      sums.push_back(MakeTensor(values, {static_cast<int64_t>(values.size())},
                                DataType::kFloat32, false, reinterpret_cast<void*>(8)));
      copies.push_back(MakeTensor(values, {static_cast<int64_t>(values.size())},
                                  DataType::kFloat32, false, reinterpret_cast<void*>(8)));
      if (joined) {
        MakeStandIn(sums.back().get());
        MakeStandIn(copies.back().get());
      }
      sum_raw.push_back(sums.back().get());
      copy_raw.push_back(copies.back().get());
    }
    hvdkeras::PendingOp sum = MakeOp(OpType::kAllreduce, sum_raw, ReduceOp::kSum);
    hvdkeras::PendingOp copy = MakeOp(OpType::kBroadcast, copy_raw);
    hvdkeras::ExecContext ctx = w.Context();
    CHECK(hvdkeras::RunDeviceAllreduce(ctx, {&sum}).ok());
    CHECK(hvdkeras::RunDeviceBroadcast(ctx, {&copy}).ok());
    if (joined) continue;
    const int contributing = w.size() > 1 ? w.size() - 1 : 1;
    const float total = contributing * (contributing + 1) / 2.0f;
    for (int i = 0; i < count; ++i) {
      CHECK_EQ(Values<float>(*sums[i], false), std::vector<float>(4 + 70 * i, total));
      CHECK_EQ(Values<float>(*copies[i], false), std::vector<float>(4 + 70 * i, 1.0f));
    }
  }
}

TEST(BroadcastFillsEveryRanksOutputsTheRootsToo) {
  World& w = W();
  const int root = w.size() - 1;
  for (int count : {1, 3}) {  // a lone tensor, and a fused batch
    std::vector<std::unique_ptr<Tensor>> tensors;
    std::vector<Tensor*> raw;
    for (int i = 0; i < count; ++i) {
      std::vector<int8_t> values(5 + 60 * i);
      for (size_t j = 0; j < values.size(); ++j) values[j] = static_cast<int8_t>(w.rank() * 10 + j % 7 + i);
      tensors.push_back(MakeTensor(values, {static_cast<int64_t>(values.size())},
                                   DataType::kInt8, i == 1, reinterpret_cast<void*>(3)));
      raw.push_back(tensors.back().get());
    }
    hvdkeras::PendingOp op = MakeOp(OpType::kBroadcast, raw);
    op.request.root_rank = root;
    hvdkeras::ExecContext ctx = w.Context();
    CHECK(hvdkeras::RunDeviceBroadcast(ctx, {&op}).ok());
    for (int i = 0; i < count; ++i) {
      std::vector<int8_t> expected(5 + 60 * i);
      for (size_t j = 0; j < expected.size(); ++j) expected[j] = static_cast<int8_t>(root * 10 + j % 7 + i);
      CHECK_EQ(Values<int8_t>(*tensors[i], i == 1), expected);
    }
  }
}

TEST(AllgatherPlacesEachRanksRowsAndWaitsBeforeWriting) {
  World& w = W();
  g_log.clear();
  const int width = 3;
  auto rows = [](int t, int r) { return t == 0 ? r + 1 : (r == 0 ? 0 : 2); };
  auto value = [](int t, int r, int row, int col) { return 100.0f * t + 10 * r + row + 0.25f * col; };
  std::vector<std::unique_ptr<Tensor>> tensors;
  for (int t = 0; t < 2; ++t) {
    std::vector<float> mine;
    for (int row = 0; row < rows(t, w.rank()); ++row) {
      for (int col = 0; col < width; ++col) mine.push_back(value(t, w.rank(), row, col));
    }
    tensors.push_back(MakeTensor(mine, {rows(t, w.rank()), width}, DataType::kFloat32, false,
                                 reinterpret_cast<void*>(21), /*lazy_output=*/true));
  }
  hvdkeras::PendingOp op = MakeOp(OpType::kAllgather, {tensors[0].get(), tensors[1].get()});
  auto response = std::make_shared<hvdkeras::Response>();
  for (int t = 0; t < 2; ++t) {
    for (int r = 0; r < w.size(); ++r) response->sizes.push_back(rows(t, r));
  }
  op.response = response;
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceAllgather(ctx, {&op}).ok());
  for (int t = 0; t < 2; ++t) {
    std::vector<float> expected;
    for (int r = 0; r < w.size(); ++r) {
      for (int row = 0; row < rows(t, r); ++row) {
        for (int col = 0; col < width; ++col) expected.push_back(value(t, r, row, col));
      }
    }
    std::vector<float> got = Values<float>(*tensors[t], false);
    got.resize(expected.size());
    CHECK_EQ(got, expected);
  }
  // The engine stream waits for the framework stream after allocating the
  // outputs and before anything writes them.
  const auto last_alloc = std::find(g_log.rbegin(), g_log.rend(), "alloc").base();
  const auto wait = std::find(g_log.begin(), g_log.end(), "wait 21");
  const auto first_write = std::find_if(g_log.begin(), g_log.end(), [](const std::string& s) {
    return s == "copy" || s == "exchange";
  });
  CHECK(last_alloc <= wait && wait < first_write);
  CheckReleased({reinterpret_cast<void*>(21)});
}

TEST(AlltoallSendsEachRankItsRows) {
  World& w = W();
  const int n = w.size();
  auto rows = [](int from, int to) { return (from + to) % 3; };
  auto value = [](int from, int to, int row, int col) { return 1000 * from + 100 * to + 10 * row + col; };
  std::vector<int32_t> mine;
  std::vector<int64_t> splits;
  int64_t my_rows = 0;
  for (int to = 0; to < n; ++to) {
    splits.push_back(rows(w.rank(), to));
    my_rows += rows(w.rank(), to);
    for (int row = 0; row < rows(w.rank(), to); ++row) {
      for (int col = 0; col < 2; ++col) mine.push_back(value(w.rank(), to, row, col));
    }
  }
  auto t = MakeTensor(mine, {my_rows, 2}, DataType::kInt32, false, reinterpret_cast<void*>(31),
                      /*lazy_output=*/true);
  std::vector<int64_t> received;
  t->ref.receive_splits = [&received](const std::vector<int64_t>& got) { received = got; };
  hvdkeras::PendingOp op = MakeOp(OpType::kAlltoall, {t.get()});
  op.request.splits = splits;
  auto response = std::make_shared<hvdkeras::Response>();
  for (int from = 0; from < n; ++from) {
    for (int to = 0; to < n; ++to) response->sizes.push_back(rows(from, to));
  }
  op.response = response;
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceAlltoall(ctx, &op).ok());
  std::vector<int32_t> expected;
  std::vector<int64_t> expected_splits;
  for (int from = 0; from < n; ++from) {
    expected_splits.push_back(rows(from, w.rank()));
    for (int row = 0; row < rows(from, w.rank()); ++row) {
      for (int col = 0; col < 2; ++col) expected.push_back(value(from, w.rank(), row, col));
    }
  }
  std::vector<int32_t> got = Values<int32_t>(*t, false);
  got.resize(expected.size());
  CHECK_EQ(got, expected);
  CHECK_EQ(received, expected_splits);
}

TEST(ReducescatterKeepsThisRanksRows) {
  World& w = W();
  const int64_t rows = 7, width = 2;
  for (ReduceOp reduce : {ReduceOp::kSum, ReduceOp::kAverage}) {
    g_log.clear();
    std::vector<float> values;
    for (int64_t i = 0; i < rows * width; ++i) values.push_back(static_cast<float>(i % 6 + w.rank()));
    auto t = MakeTensor(values, {rows, width}, DataType::kFloat32, false,
                        reinterpret_cast<void*>(41), /*lazy_output=*/true);
    hvdkeras::PendingOp op = MakeOp(OpType::kReducescatter, {t.get()}, reduce, 0.5, 4.0);
    hvdkeras::ExecContext ctx = w.Context();
    CHECK(hvdkeras::RunDeviceReducescatter(ctx, {&op}).ok());
    int64_t first = 0;
    for (int r = 0; r < w.rank(); ++r) first += hvdkeras::ScatterRows(rows, w.size(), r);
    const int64_t mine = hvdkeras::ScatterRows(rows, w.size(), w.rank());
    const int divisor = reduce == ReduceOp::kAverage ? w.size() : 1;
    std::vector<float> expected;
    for (int64_t i = first * width; i < (first + mine) * width; ++i) {
      float sum = 0;
      for (int r = 0; r < w.size(); ++r) sum += 0.5f * static_cast<float>(i % 6 + r);
      expected.push_back(static_cast<float>(static_cast<double>(sum) / divisor * 4.0));
    }
    std::vector<float> got = Values<float>(*t, false);
    got.resize(expected.size());
    CHECK_EQ(got, expected);
    // 7 rows divide over one rank only: uneven rows reduce the whole tensor.
    const bool whole = rows % w.size() != 0;
    CHECK_EQ(std::find(g_log.begin(), g_log.end(), "allreduce") != g_log.end(), whole);
    CheckReleased({reinterpret_cast<void*>(41)});
  }
}

TEST(ReducescatterOfEqualBlocksIsOneReduceScatter) {
  // Note [reduce-scatter in equal blocks]: rows that divide by the ranks
  // take the communicator's reduce-scatter (no allreduce), several tensors
  // of different widths fused, prescaled, averaged and postscaled.
  World& w = W();
  g_log.clear();
  const int n = w.size();
  const std::vector<int64_t> rows{2L * n, 3L * n}, widths{3, 1};
  std::vector<std::unique_ptr<Tensor>> tensors;
  for (size_t t = 0; t < rows.size(); ++t) {
    std::vector<float> values;
    for (int64_t i = 0; i < rows[t] * widths[t]; ++i) values.push_back(Contribution(i, t, w.rank()));
    tensors.push_back(MakeTensor(values, {rows[t], widths[t]}, DataType::kFloat32, false,
                                 reinterpret_cast<void*>(51), /*lazy_output=*/t == 1));
  }
  hvdkeras::PendingOp op = MakeOp(OpType::kReducescatter, {tensors[0].get(), tensors[1].get()},
                                  ReduceOp::kAverage, 2.0, 0.5);
  hvdkeras::ExecContext ctx = w.Context();
  CHECK(hvdkeras::RunDeviceReducescatter(ctx, {&op}).ok());
  for (size_t t = 0; t < rows.size(); ++t) {
    const int64_t mine = rows[t] / n, first = mine * w.rank();
    std::vector<float> expected;
    for (int64_t i = first * widths[t]; i < (first + mine) * widths[t]; ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += 2.0f * Contribution(i, t, r);
      expected.push_back(sum / n * 0.5f);
    }
    std::vector<float> got = Values<float>(*tensors[t], false);
    got.resize(expected.size());
    CHECK_EQ(got, expected);
  }
  CHECK(std::find(g_log.begin(), g_log.end(), "reducescatter") != g_log.end());
  CHECK(std::find(g_log.begin(), g_log.end(), "allreduce") == g_log.end());
  CheckReleased({reinterpret_cast<void*>(51)});
}

TEST(AllgatherOfEqualRowsIsOneAllgather) {
  // Note [allgather in equal blocks]: one tensor straight into its output,
  // and several through the fused buffer; no pairwise exchange.
  World& w = W();
  const int n = w.size();
  auto value = [](int t, int r, int row, int col) { return 100.0f * t + 10 * r + row + 0.5f * col; };
  for (int count : {1, 3}) {
    g_log.clear();
    std::vector<std::unique_ptr<Tensor>> tensors;
    std::vector<Tensor*> raw;
    auto response = std::make_shared<hvdkeras::Response>();
    for (int t = 0; t < count; ++t) {
      const int rows = t + 1, width = 2 + t;
      std::vector<float> mine;
      for (int row = 0; row < rows; ++row) {
        for (int col = 0; col < width; ++col) mine.push_back(value(t, w.rank(), row, col));
      }
      tensors.push_back(MakeTensor(mine, {rows, width}, DataType::kFloat32, false,
                                   reinterpret_cast<void*>(61), /*lazy_output=*/true));
      raw.push_back(tensors.back().get());
      for (int r = 0; r < n; ++r) response->sizes.push_back(rows);
    }
    hvdkeras::PendingOp op = MakeOp(OpType::kAllgather, raw);
    op.response = response;
    hvdkeras::ExecContext ctx = w.Context();
    CHECK(hvdkeras::RunDeviceAllgather(ctx, {&op}).ok());
    for (int t = 0; t < count; ++t) {
      std::vector<float> expected;
      for (int r = 0; r < n; ++r) {
        for (int row = 0; row < t + 1; ++row) {
          for (int col = 0; col < 2 + t; ++col) expected.push_back(value(t, r, row, col));
        }
      }
      std::vector<float> got = Values<float>(*tensors[t], false);
      got.resize(expected.size());
      CHECK_EQ(got, expected);
    }
    CHECK(std::find(g_log.begin(), g_log.end(), "allgather") != g_log.end());
    CHECK(std::find(g_log.begin(), g_log.end(), "exchange") == g_log.end());
    CheckReleased({reinterpret_cast<void*>(61)});
  }
}

}  // namespace

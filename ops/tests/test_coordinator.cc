// Unit tests of the coordinator (core/coordinator.cc): readiness, join,
// stalls and ready times, and ValidateRequests' mismatch messages.
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "core/coordinator.h"
#include "tests/harness.h"
#include "tests/requests.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::OpType;
using hvdkeras::ReduceOp;
using hvdkeras::Request;
using hvdkeras::Response;
using hvdkeras::Shape;
using test_harness::Allreduce;
using test_harness::Alltoall;
using test_harness::Broadcast;
using test_harness::Join;
using test_harness::OfType;

// ==========================================================================
// Coordinator and ValidateRequests
// ==========================================================================

using hvdkeras::SteadyClock;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::vector<std::string> Names(const std::vector<Response>& responses) {
  std::vector<std::string> names;
  for (const Response& r : responses) names.push_back(r.name);
  return names;
}

// ValidateRequests over the given requests; no rank has joined unless said.
std::string Validate(const std::vector<Request>& submitted, int world_size,
                     std::vector<bool> joined = {}) {
  if (joined.empty()) joined.assign(world_size, false);
  return hvdkeras::ValidateRequests(submitted, world_size, joined);
}

const SteadyClock::time_point kT0 = SteadyClock::time_point(seconds(1000));

TEST(CoordinatorReadyOnlyWhenAllRanksSent) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK(c.TakeReady().empty());
  CHECK(!c.has_ready());
  CHECK_EQ(c.pending_count(), size_t{1});
  c.Add(Allreduce("x", 1), kT0);  // a repeat from the same rank does not count twice
  CHECK(c.TakeReady().empty());
  c.Add(Allreduce("x", 2), kT0);
  CHECK(c.has_ready());
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].name, std::string("x"));
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].error, std::string(""));
    CHECK(ready[0].agreed.SameSignature(Allreduce("x", 0)));
  }
  CHECK_EQ(c.pending_count(), size_t{0});
  CHECK(c.TakeReady().empty());  // taken once

  // The name can be used again afterwards.
  c.Add(Allreduce("x", 2), kT0);
  CHECK(c.TakeReady().empty());
  CHECK_EQ(c.pending_count(), size_t{1});

  // A world of one: ready at once.
  hvdkeras::Coordinator solo(1);
  solo.Add(Allreduce("y", 0), kT0);
  CHECK_EQ(Names(solo.TakeReady()), std::vector<std::string>{"y"});
}

TEST(CoordinatorReadyOrderIsCompletionOrder) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("y", 0), kT0);
  c.Add(Allreduce("z", 0), kT0);
  c.Add(Allreduce("z", 1), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK_EQ(c.pending_count(), size_t{1});
  c.Add(Allreduce("y", 1), kT0);
  CHECK_EQ(Names(c.TakeReady()), (std::vector<std::string>{"z", "x", "y"}));

  // Names that become ready in separate calls come out separately.
  c.Add(Allreduce("b", 1), kT0);
  c.Add(Allreduce("a", 1), kT0);
  c.Add(Allreduce("a", 0), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"a"});
  c.Add(Allreduce("b", 0), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"b"});
}

TEST(CoordinatorMismatchGivesErrorResponse) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0, {2, 3}), kT0);
  c.Add(Allreduce("x", 1, {3, 3}), kT0);
  c.Add(Allreduce("ok", 1), kT0);
  c.Add(Allreduce("ok", 0), kT0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), (std::vector<std::string>{"x", "ok"}));
  if (ready.size() == 2) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error,
             std::string("Mismatched shapes for allreduce of tensor 'x' across ranks: [2, 3] "
                         "from rank 0; [3, 3] from rank 1. Every rank must submit the same "
                         "shapes under one name."));
    CHECK_EQ(ready[1].kind, Response::Kind::kOk);
  }
  CHECK_EQ(c.pending_count(), size_t{0});
}

TEST(CoordinatorJoinedRanksCountAsReady) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 1), kT0);
  CHECK(!c.any_joined());
  c.Add(Join(2), kT0);  // x only waited for rank 2
  CHECK(c.any_joined());
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"x"});
  if (ready.size() == 1) CHECK_EQ(ready[0].kind, Response::Kind::kOk);

  c.Add(Allreduce("y", 0), kT0);
  CHECK(c.TakeReady().empty());  // rank 1 has neither sent y nor joined
  c.Add(Allreduce("y", 1), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"y"});

  // The join completes once every rank has joined, naming the last one.
  c.Add(Join(0), kT0);
  CHECK(c.TakeReady().empty());
  c.Add(Join(1), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"join"});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].last_joined_rank, 1);
  }
  CHECK(!c.any_joined());
  CHECK_EQ(c.pending_count(), size_t{0});

  // Afterwards every rank counts again.
  c.Add(Allreduce("z", 0), kT0);
  c.Add(Allreduce("z", 1), kT0);
  CHECK(c.TakeReady().empty());
  c.Add(Allreduce("z", 2), kT0);
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"z"});
}

TEST(CoordinatorJoinPromotesWaitingNamesInArrivalOrder) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("b", 0), kT0);
  c.Add(Allreduce("a", 0), kT0);
  c.Add(Allreduce("c", 0), kT0);
  c.Add(Join(1), kT0);
  // Promoted in the order the names were first seen, not by name.
  CHECK_EQ(Names(c.TakeReady()), (std::vector<std::string>{"b", "a", "c"}));
  // A broadcast whose root has joined fails on the ranks that submitted it.
  c.Add(Broadcast("bc", 0, 1), kT0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"bc"});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error, std::string("Cannot run broadcast of tensor 'bc': its root rank 1 "
                                         "has already called join()."));
  }
  c.Add(Broadcast("bc0", 0, 0), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"bc0"});
  if (ready.size() == 1) CHECK_EQ(ready[0].kind, Response::Kind::kOk);
  c.Add(Join(0), kT0);
  ready = c.TakeReady();
  CHECK_EQ(Names(ready), std::vector<std::string>{"join"});
  if (ready.size() == 1) CHECK_EQ(ready[0].last_joined_rank, 0);
}

TEST(CoordinatorAllgatherAndAlltoallSizes) {
  hvdkeras::Coordinator c(3);
  const int64_t first_dims[3][2] = {{2, 3}, {5, 3}, {1, 0}};
  for (int r = 0; r < 3; ++r) {
    Request g = OfType(OpType::kAllgather, "g", r);
    g.dtypes = {DataType::kFloat32, DataType::kInt32};
    g.shapes = {{first_dims[r][0], 4}, {first_dims[r][1]}};
    c.Add(g, kT0);
  }
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{2, 5, 1, 3, 3, 0}));  // tensor-major
  }

  c.Add(Alltoall("a", 0, 3, {1, 2, 0}), kT0);
  c.Add(Alltoall("a", 1, 5, {0, 5, 0}), kT0);
  c.Add(Alltoall("a", 2, 1, {1, 0, 0}), kT0);
  ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kOk);
    CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{1, 2, 0, 0, 5, 0, 1, 0, 0}));
  }

  // A joined rank contributes zero rows.
  c.Add(Join(1), kT0);
  c.Add(OfType(OpType::kAllgather, "h", 0, {2, 4}), kT0);
  c.Add(OfType(OpType::kAllgather, "h", 2, {6, 4}), kT0);
  ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) CHECK_EQ(ready[0].sizes, (std::vector<int64_t>{2, 0, 6}));
}

TEST(CoordinatorStalls) {
  hvdkeras::Coordinator c(3);
  c.Add(Allreduce("x", 0), kT0);
  c.Add(Allreduce("x", 2), kT0 + seconds(1));
  CHECK(c.FindStalls(kT0 + seconds(5), 10.0).empty());
  std::vector<hvdkeras::Stall> stalls = c.FindStalls(kT0 + seconds(11), 10.0);
  CHECK_EQ(stalls.size(), size_t{1});
  if (stalls.size() == 1) {
    CHECK_EQ(stalls[0].name, std::string("x"));
    CHECK_EQ(stalls[0].seconds, 11.0);  // measured from the first submission
    CHECK_EQ(stalls[0].submitted, (std::vector<int>{0, 2}));
    CHECK_EQ(stalls[0].missing, std::vector<int>{1});
  }
  CHECK(c.FindStalls(kT0 + seconds(12), 10.0).empty());  // reported once...
  CHECK_EQ(c.FindStalls(kT0 + seconds(12), 10.0, /*only_new=*/false).size(), size_t{1});

  // A request's age moves its start back: y was sent at 11 s after waiting
  // 20 s on its rank.
  Request y = Allreduce("y", 0);
  y.age_seconds = 20.0;
  c.Add(y, kT0 + seconds(11));
  stalls = c.FindStalls(kT0 + seconds(12), 20.0);
  CHECK_EQ(stalls.size(), size_t{1});
  if (stalls.size() == 1) {
    CHECK_EQ(stalls[0].name, std::string("y"));
    CHECK_EQ(stalls[0].seconds, 21.0);
  }

  // Failing stalled names turns them into error responses, in name order.
  c.FailStalled(kT0 + seconds(30), 10.0);
  CHECK_EQ(c.pending_count(), size_t{0});
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(Names(ready), (std::vector<std::string>{"x", "y"}));
  if (ready.size() == 2) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error,
             std::string("Collective 'x' stalled for 30 s: rank(s) 1 never submitted it (rank(s) "
                         "0, 2 did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS. Rank(s) "
                         "1 wait in no collective: they run their own code (a longer loop, a "
                         "step only they take), are stuck, or have finished. Check that every "
                         "rank runs the same collectives (e.g. the same number of steps)."));
    CHECK_EQ(ready[1].kind, Response::Kind::kError);
    CHECK_EQ(ready[1].error,
             std::string("Collective 'y' stalled for 39 s: rank(s) 1, 2 never submitted it "
                         "(rank(s) 0 did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS. "
                         "Meanwhile rank 2 waits in 'x' instead: the ranks are running different "
                         "collectives, so the program diverged (a rank skipped, added or "
                         "reordered a collective, or caught an error and went on). Rank(s) 1 "
                         "wait in no collective: they run their own code (a longer loop, a step "
                         "only they take), are stuck, or have finished. Check that every rank "
                         "runs the same collectives (e.g. the same number of steps)."));
  }
  // Names under the limit are left alone.
  c.Add(Allreduce("z", 0), kT0 + seconds(30));
  c.FailStalled(kT0 + seconds(31), 10.0);
  CHECK(c.TakeReady().empty());
  CHECK_EQ(c.pending_count(), size_t{1});

  // Joined ranks are not listed as missing.
  hvdkeras::Coordinator j(3);
  j.Add(Join(1), kT0);
  j.Add(Allreduce("w", 0), kT0);
  bool found = false;
  for (const hvdkeras::Stall& stall : j.FindStalls(kT0 + seconds(60), 10.0)) {
    CHECK(stall.name != "hvdkeras.join");  // waiting in join() is not a stall
    if (stall.name != "w") continue;
    found = true;
    CHECK_EQ(stall.submitted, std::vector<int>{0});
    CHECK_EQ(stall.missing, std::vector<int>{2});
  }
  CHECK(found);
  // ... and is never ended by the stall shutdown either, while the rank it
  // waits for is still busy (it submitted something within twice the bound;
  // without that, how long it had been quiet would depend on when the
  // coordinator was made, which is the machine's uptime on this clock).
  j.Add(Allreduce("v", 2), kT0 + seconds(110));
  j.FailStalled(kT0 + seconds(120), 10.0);
  for (const Response& r : j.TakeReady()) CHECK(r.name != "hvdkeras.join");
  CHECK(j.any_joined());
}

TEST(CoordinatorStallSaysWhereMissingRanksWait) {
  // Rank 0 skipped 'a' and went on to 'b'; rank 1 waits in 'a'. Each stall
  // names the collective the other rank waits in instead.
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("a", 1), kT0);
  c.Add(Allreduce("b", 0), kT0 + seconds(1));
  c.Add(Allreduce("c", 0), kT0 + seconds(2));
  std::vector<hvdkeras::Stall> stalls = c.FindStalls(kT0 + seconds(20), 10.0);
  CHECK_EQ(stalls.size(), size_t{3});
  for (const hvdkeras::Stall& stall : stalls) {
    CHECK_EQ(stall.waiting_instead.size(), stall.missing.size());
    if (stall.name == "a") {
      CHECK_EQ(stall.waiting_instead[0], (std::vector<std::string>{"b", "c"}));
      CHECK_EQ(hvdkeras::ExplainStall(stall),
               std::string(". Meanwhile rank 0 waits in 'b', 'c' instead: the ranks are running "
                           "different collectives, so the program diverged (a rank skipped, "
                           "added or reordered a collective, or caught an error and went on)"));
    } else {
      CHECK_EQ(stall.waiting_instead[0], std::vector<std::string>{"a"});
    }
  }
}

TEST(CoordinatorEndsAJoinOnlyWhenTheOthersGoQuiet) {
  hvdkeras::Coordinator c(3);
  const auto start = hvdkeras::SteadyClock::now();
  c.Add(Join(0), start);
  c.Add(Join(1), start);
  // Rank 2 keeps running collectives (with stand-ins for the joined ranks):
  // the join waits as long as it takes.
  for (int s = 5; s <= 60; s += 5) {
    c.Add(Allreduce("step" + std::to_string(s), 2), start + seconds(s));
    c.TakeReady();
    c.FailStalled(start + seconds(s + 1), 10.0);
    CHECK(c.TakeReady().empty());
  }
  // Then it goes quiet without joining: after twice the bound, the join
  // fails.
  c.FailStalled(start + seconds(75), 10.0);
  CHECK(c.TakeReady().empty());
  c.FailStalled(start + seconds(81), 10.0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) {
    CHECK_EQ(ready[0].kind, Response::Kind::kError);
    CHECK_EQ(ready[0].error.substr(0, 103),
             std::string("join() waited 81 s for rank(s) 2, which neither joined nor submitted "
                         "any collective for twice the bound"));
  }
  // The joined ranks are ranks again: a new collective waits for all three.
  CHECK(!c.any_joined());
  c.Add(Allreduce("after", 0), start + seconds(82));
  CHECK(c.TakeReady().empty());
}

TEST(CoordinatorStallShutdownAfterTheCycleRequests) {
  // See Note [stall shutdown after the cycle's requests]: rank 1's request
  // arrives in the cycle whose slow path fails stalled names. Added first,
  // it completes the name instead of being failed with it.
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0), kT0);
  CHECK(c.AnyStalled(kT0 + seconds(31), 30.0));
  c.Add(Allreduce("x", 1), kT0 + seconds(31));
  c.FailStalled(kT0 + seconds(31), 30.0);
  std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{1});
  if (ready.size() == 1) CHECK_EQ(ready[0].kind, Response::Kind::kOk);
  CHECK_EQ(c.pending_count(), size_t{0});
  CHECK(!c.AnyStalled(kT0 + seconds(60), 30.0));
}

TEST(CoordinatorIgnoresRanksOutsideTheWorld) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 5), kT0);
  c.Add(Allreduce("x", -1), kT0);
  CHECK_EQ(c.pending_count(), size_t{0});
}

TEST(CoordinatorReadyTimes) {
  hvdkeras::Coordinator c(2);
  c.Add(Allreduce("x", 0), kT0);
  Request late = Allreduce("x", 1);
  late.age_seconds = 0.5;
  c.Add(late, kT0 + seconds(2));
  CHECK_EQ(Names(c.TakeReady()), std::vector<std::string>{"x"});
  const auto& times = c.ready_times();
  CHECK_EQ(times.count("x"), size_t{1});
  if (times.count("x") == 1 && times.at("x").size() == 2) {
    CHECK(times.at("x")[0] == kT0);
    CHECK(times.at("x")[1] == kT0 + milliseconds(1500));
  }
  CHECK(c.TakeReady().empty());
  CHECK(c.ready_times().empty());
}

TEST(ValidateMatchingRequests) {
  CHECK_EQ(Validate({Allreduce("x", 0)}, 1), std::string(""));
  CHECK_EQ(Validate({Allreduce("x", 0), Allreduce("x", 1), Allreduce("x", 2)}, 3),
           std::string(""));
  // Multi-tensor requests that agree.
  Request g0 = Allreduce("g", 0), g1 = Allreduce("g", 1);
  for (Request* g : {&g0, &g1}) {
    g->dtypes = {DataType::kFloat32, DataType::kFloat32};
    g->shapes = {{2}, {}};
    g->reduce_op = ReduceOp::kAverage;
    g->prescale = 0.5;
    g->postscale = 3.0;
  }
  CHECK_EQ(Validate({g0, g1}, 2), std::string(""));
  // Broadcasts ignore the reduction fields.
  Request b0 = Broadcast("b", 0, 1), b1 = Broadcast("b", 1, 1);
  b1.reduce_op = ReduceOp::kMax;
  b1.prescale = 7.0;
  CHECK_EQ(Validate({b0, b1}, 2), std::string(""));
  // Allgather and alltoall: first dimensions may differ.
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1, 3}),
                     OfType(OpType::kAllgather, "g", 1, {7, 3})},
                    2),
           std::string(""));
  CHECK_EQ(Validate({Alltoall("a", 0, 3, {1, 2}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string(""));
  // Only the submitting ranks are compared (rank 1 has joined).
  CHECK_EQ(Validate({Allreduce("x", 0), Allreduce("x", 2)}, 3, {false, true, false}),
           std::string(""));
}

TEST(ValidateMismatchMessages) {
  const std::string tail = ". Every rank must submit the same ";

  // Shapes, grouping ranks that agree (the example from coordinator.cc).
  CHECK_EQ(Validate({Allreduce("x", 0, {2, 3}), Allreduce("x", 1, {3, 3}),
                     Allreduce("x", 2, {2, 3})},
                    3),
           "Mismatched shapes for allreduce of tensor 'x' across ranks: [2, 3] from ranks 0, 2; "
           "[3, 3] from rank 1" + tail + "shapes under one name.");
  // Scalars print as [].
  CHECK_EQ(Validate({Allreduce("s", 0, {}), Allreduce("s", 1, {1})}, 2),
           "Mismatched shapes for allreduce of tensor 's' across ranks: [] from rank 0; [1] "
           "from rank 1" + tail + "shapes under one name.");
  // Ranks are named by the requests' own rank fields (here rank 1 joined).
  CHECK_EQ(Validate({Allreduce("x", 0, {1}), Allreduce("x", 2, {2})}, 3, {false, true, false}),
           "Mismatched shapes for allreduce of tensor 'x' across ranks: [1] from rank 0; [2] "
           "from rank 2" + tail + "shapes under one name.");

  // Data types.
  CHECK_EQ(Validate({Allreduce("x", 0, {2}, DataType::kFloat32),
                     Allreduce("x", 1, {2}, DataType::kFloat16),
                     Allreduce("x", 2, {2}, DataType::kBFloat16),
                     Allreduce("x", 3, {2}, DataType::kFloat16)},
                    4),
           "Mismatched data types for allreduce of tensor 'x' across ranks: float32 from rank "
           "0; float16 from ranks 1, 3; bfloat16 from rank 2" + tail +
               "data types under one name.");

  // Reduce ops.
  {
    Request a = Allreduce("x", 0), b = Allreduce("x", 1);
    a.reduce_op = ReduceOp::kSum;
    b.reduce_op = ReduceOp::kAverage;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched reduction ops for allreduce of tensor 'x' across ranks: Sum from rank "
             "0; Average from rank 1" + tail + "reduction ops under one name.");
  }

  // Scale factors (pre and post).
  {
    Request a = Allreduce("x", 0), b = Allreduce("x", 1);
    b.postscale = 0.25;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched scale factors for allreduce of tensor 'x' across ranks: prescale 1 / "
             "postscale 1 from rank 0; prescale 1 / postscale 0.25 from rank 1" + tail +
                 "scale factors under one name.");
    b.postscale = 1.0;
    b.prescale = 0.5;
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched scale factors for allreduce of tensor 'x' across ranks: prescale 1 / "
             "postscale 1 from rank 0; prescale 0.5 / postscale 1 from rank 1" + tail +
                 "scale factors under one name.");
  }

  // Broadcast roots.
  CHECK_EQ(Validate({Broadcast("b", 0, 0), Broadcast("b", 1, 1)}, 2),
           "Mismatched root ranks for broadcast of tensor 'b' across ranks: root 0 from rank 0; "
           "root 1 from rank 1" + tail + "root ranks under one name.");

  // Devices: host memory on one rank, GPU memory on another.
  {
    Request gpu = Allreduce("x", 1, {2, 3});
    gpu.device = hvdkeras::DeviceKind::kGpu;
    CHECK_EQ(Validate({Allreduce("x", 0, {2, 3}), gpu}, 2),
             std::string("Mismatched devices for allreduce of tensor 'x' across ranks: CPU from "
                         "rank 0; GPU from rank 1. Every rank must hold the tensor in the same "
                         "kind of memory: give every process a GPU (hvdkeras.pin_gpu()) or "
                         "none."));
  }

  // Op types (checked first, even when other fields differ too).
  {
    Request a = Allreduce("x", 0, {5}, DataType::kInt32);
    Request b = Broadcast("x", 1, 0);
    b.shapes = {{7}};
    const std::string expected =
        "Mismatched operations for tensor 'x' across ranks: allreduce from rank 0; broadcast "
        "from rank 1. Every rank must run the same collective under one name.";
    CHECK_EQ(Validate({a, b}, 2), expected);
    CHECK_EQ(Validate({b, a}, 2),
             std::string("Mismatched operations for tensor 'x' across ranks: broadcast from "
                         "rank 1; allreduce from rank 0. Every rank must run the same "
                         "collective under one name."));
  }

  // Tensor counts in a group (checked before dtypes and shapes).
  {
    Request a = Allreduce("g", 0), b = Allreduce("g", 1, {7}, DataType::kInt8);
    a.dtypes = {DataType::kFloat32, DataType::kFloat32};
    a.shapes = {{2}, {3}};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched tensor counts for allreduce of tensor 'g' across ranks: 2 tensor(s) "
             "from rank 0; 1 tensor(s) from rank 1" + tail + "tensor counts under one name.");
  }

  // Multi-tensor shapes and dtypes print as tuples.
  {
    Request a = Allreduce("g", 0), b = Allreduce("g", 1);
    a.dtypes = b.dtypes = {DataType::kFloat32, DataType::kFloat32};
    a.shapes = {{2}, {3}};
    b.shapes = {{2}, {4, 1}};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched shapes for allreduce of tensor 'g' across ranks: ([2], [3]) from rank "
             "0; ([2], [4, 1]) from rank 1" + tail + "shapes under one name.");
    b.shapes = a.shapes;
    b.dtypes = {DataType::kFloat32, DataType::kInt64};
    CHECK_EQ(Validate({a, b}, 2),
             "Mismatched data types for allreduce of tensor 'g' across ranks: (float32, float32) "
             "from rank 0; (float32, int64) from rank 1" + tail + "data types under one name.");
  }

  // Dtype is checked before shape.
  CHECK_EQ(Validate({Allreduce("x", 0, {1}, DataType::kInt32),
                     Allreduce("x", 1, {2}, DataType::kInt64)},
                    2),
           "Mismatched data types for allreduce of tensor 'x' across ranks: int32 from rank 0; "
           "int64 from rank 1" + tail + "data types under one name.");

  // Allgather: all dimensions but the first must match; no scalars.
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1, 3}),
                     OfType(OpType::kAllgather, "g", 1, {1, 4})},
                    2),
           "Mismatched shapes (all dimensions but the first must match) for allgather of tensor "
           "'g' across ranks: [*, 3] from rank 0; [*, 4] from rank 1" + tail +
               "shapes (all dimensions but the first must match) under one name.");
  CHECK_EQ(Validate({OfType(OpType::kAllgather, "g", 0, {1}),
                     OfType(OpType::kAllgather, "g", 1, {})},
                    2),
           std::string("Cannot run allgather of tensor 'g': rank 1 sent a scalar, but allgather "
                       "needs at least one dimension."));
  // Reducescatter: no scalars.
  CHECK_EQ(Validate({OfType(OpType::kReducescatter, "r", 0, {}),
                     OfType(OpType::kReducescatter, "r", 1, {})},
                    2),
           std::string("Cannot run reducescatter of tensor 'r': rank 0 sent a scalar, but "
                       "reducescatter splits the first dimension."));
}

TEST(ValidateAlltoallSplits) {
  CHECK_EQ(Validate({Alltoall("a", 0, 3, {1, 2}), Alltoall("a", 1, 3, {3})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 1 gave 1 split(s), but "
                       "the world has 2 rank(s); give one row count per rank."));
  CHECK_EQ(Validate({Alltoall("a", 0, 1, {2, -1}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 0 gave a negative row "
                       "count -1."));
  CHECK_EQ(Validate({Alltoall("a", 0, 4, {1, 2}), Alltoall("a", 1, 0, {0, 0})}, 2),
           std::string("Invalid splits for alltoall of tensor 'a': rank 0's splits add up to 3 "
                       "rows, but its tensor has 4 rows."));
}

TEST(ValidateInvalidBroadcastRoot) {
  CHECK_EQ(Validate({Broadcast("b", 0, 2), Broadcast("b", 1, 2)}, 2),
           std::string("Invalid root rank 2 for broadcast of tensor 'b': the world has 2 "
                       "rank(s), so the root must be in 0..1."));
  CHECK_EQ(Validate({Broadcast("b", 0, -1)}, 1),
           std::string("Invalid root rank -1 for broadcast of tensor 'b': the world has 1 "
                       "rank(s), so the root must be in 0..0."));
  CHECK_EQ(Validate({Broadcast("b", 0, 1), Broadcast("b", 1, 1)}, 2), std::string(""));
  CHECK_EQ(Validate({Broadcast("b", 0, 1)}, 2, {false, true}),
           std::string("Cannot run broadcast of tensor 'b': its root rank 1 has already called "
                       "join()."));
}

// Note [one reference request per name]: a world of 16,384 ranks where
// every rank sends the same allreduces and allgathers, one rank's rows
// differing, and one rank sending a different shape. Checks the exact
// answers; the time it takes is printed (a count, not an assertion).
TEST(CoordinatorAtSixteenThousandRanksKeepsOneRequestPerName) {
  constexpr int kRanks = 16384;
  constexpr int kNames = 20;
  hvdkeras::Coordinator c(kRanks);
  const auto start = SteadyClock::now();
  for (int r = 0; r < kRanks; ++r) {
    for (int n = 0; n < kNames; ++n) c.Add(Allreduce("g" + std::to_string(n), r, {64, 3}), kT0);
    c.Add(OfType(OpType::kAllgather, "rows", r, {r == 77 ? 5 : 2, 3}), kT0);
    c.Add(Allreduce("bad", r, r == 9000 ? Shape{4} : Shape{2, 3}), kT0);
  }
  const double seconds_taken =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::printf("  %d ranks x %d names: %.3f s to add and answer\n", kRanks, kNames + 2,
              seconds_taken);
  const std::vector<Response> ready = c.TakeReady();
  CHECK_EQ(ready.size(), size_t{kNames + 2});
  CHECK_EQ(c.pending_count(), size_t{0});
  for (const Response& r : ready) {
    if (r.name == "rows") {
      CHECK_EQ(r.kind, Response::Kind::kOk);
      CHECK_EQ(r.sizes.size(), size_t{kRanks});
      int64_t total = 0;
      for (int64_t v : r.sizes) total += v;
      CHECK_EQ(total, int64_t{2} * kRanks + 3);
      CHECK_EQ(r.sizes[77], int64_t{5});
      CHECK_EQ(r.agreed.rank, 0);
    } else if (r.name == "bad") {
      CHECK_EQ(r.kind, Response::Kind::kError);
      CHECK_EQ(r.error, std::string("Mismatched shapes for allreduce of tensor 'bad' across "
                                    "ranks: [2, 3] from ranks 0-8999, 9001-16383; [4] from rank "
                                    "9000. Every rank must submit the same shapes under one "
                                    "name."));
    } else {
      CHECK_EQ(r.kind, Response::Kind::kOk);
      CHECK_EQ(r.agreed.shapes[0], (Shape{64, 3}));
    }
  }
}

}  // namespace

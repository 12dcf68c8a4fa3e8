// Unit tests of which agreed ops run in a cycle (core/wire_order.cc, Note
// [priority on the wire]): priority-0 ops at once, one prioritised op per
// cycle, lowest first, stand-ins flushing everything; and a randomized run
// checking that every op runs exactly once in an order every rank repeats.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/wire_order.h"
#include "tests/harness.h"

namespace {

using hvdkeras::PendingOp;
using hvdkeras::TakeRunnable;
using test_harness::Lcg;

struct Ops {
  std::vector<std::unique_ptr<PendingOp>> owned;
  PendingOp* Make(const std::string& name, int priority, bool stand_in = false) {
    owned.push_back(std::make_unique<PendingOp>());
    PendingOp* op = owned.back().get();
    op->request.name = name;
    op->request.priority = priority;
    if (!stand_in) op->done = [](const hvdkeras::Status&) {};
    return op;
  }
};

std::vector<std::string> Names(const std::vector<PendingOp*>& ops) {
  std::vector<std::string> names;
  for (const PendingOp* op : ops) names.push_back(op->request.name);
  return names;
}

TEST(WireOrderWithoutPrioritiesRunsEverythingAgreed) {
  Ops ops;
  std::vector<PendingOp*> held;
  std::vector<PendingOp*> agreed = {ops.Make("a", 0), ops.Make("b", 0)};
  CHECK_EQ(Names(TakeRunnable(agreed, &held)), (std::vector<std::string>{"a", "b"}));
  CHECK(held.empty());
  CHECK(!agreed[0]->sent);
}

TEST(WireOrderRunsOnePrioritisedOpPerCycleLowestFirst) {
  Ops ops;
  std::vector<PendingOp*> held;
  PendingOp* late = ops.Make("layer9", 9);
  std::vector<PendingOp*> agreed = {ops.Make("loss", 0), late, ops.Make("layer5", 5)};
  CHECK_EQ(Names(TakeRunnable(agreed, &held)), (std::vector<std::string>{"loss", "layer5"}));
  CHECK_EQ(Names(held), (std::vector<std::string>{"layer9"}));
  CHECK(late->sent);  // not announced again
  // One agreed later with a lower priority overtakes the held one.
  CHECK_EQ(Names(TakeRunnable({ops.Make("layer1", 1)}, &held)),
           (std::vector<std::string>{"layer1"}));
  CHECK_EQ(Names(TakeRunnable({}, &held)), (std::vector<std::string>{"layer9"}));
  CHECK(held.empty());
  CHECK(TakeRunnable({}, &held).empty());
}

TEST(WireOrderKeepsAgreementOrderAmongEqualPriorities) {
  Ops ops;
  std::vector<PendingOp*> held;
  TakeRunnable({ops.Make("x", 2), ops.Make("y", 2), ops.Make("z", 2)}, &held);
  CHECK_EQ(Names(held), (std::vector<std::string>{"y", "z"}));
  CHECK_EQ(Names(TakeRunnable({ops.Make("w", 2)}, &held)), (std::vector<std::string>{"y"}));
  CHECK_EQ(Names(held), (std::vector<std::string>{"z", "w"}));
}

TEST(WireOrderStandInsRunEverythingHeldAtOnce) {
  Ops ops;
  std::vector<PendingOp*> held;
  TakeRunnable({ops.Make("p3", 3), ops.Make("p4", 4), ops.Make("p2", 2)}, &held);
  CHECK_EQ(Names(held), (std::vector<std::string>{"p3", "p4"}));
  // A joined rank's stand-in exists for this cycle only.
  CHECK_EQ(Names(TakeRunnable({ops.Make("joined", 0, /*stand_in=*/true), ops.Make("p1", 1)},
                              &held)),
           (std::vector<std::string>{"joined", "p1", "p3", "p4"}));
  CHECK(held.empty());
}

TEST(WireOrderRandomCyclesRunEachOpOnceAndRepeat) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Lcg rng(seed);
    Ops ops;
    std::vector<std::vector<PendingOp*>> cycles;
    int made = 0;
    for (int c = 0; c < 30; ++c) {
      std::vector<PendingOp*> agreed;
      const int n = static_cast<int>(rng.Next() % 4);
      for (int i = 0; i < n; ++i) {
        agreed.push_back(ops.Make("op" + std::to_string(made++),
                                  static_cast<int>(rng.Next() % 4)));
      }
      cycles.push_back(agreed);
    }
    // Two "ranks" given the same agreements run the same ops in the same order.
    std::vector<std::string> order[2];
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<PendingOp*> held;
      for (const auto& agreed : cycles) {
        const std::vector<PendingOp*> run = TakeRunnable(agreed, &held);
        int prioritised = 0;
        for (const PendingOp* op : run) {
          prioritised += op->request.priority > 0 ? 1 : 0;
          for (const PendingOp* waiting : held) {  // nothing held outranks what ran
            CHECK(op->request.priority == 0 || waiting->request.priority >= op->request.priority);
          }
        }
        CHECK(prioritised <= 1);
        CHECK(held.empty() || prioritised == 1);
        for (const std::string& name : Names(run)) order[rank].push_back(name);
      }
      while (!held.empty()) {
        for (const std::string& name : Names(TakeRunnable({}, &held))) {
          order[rank].push_back(name);
        }
      }
    }
    CHECK_EQ(order[0], order[1]);
    CHECK_EQ(static_cast<int>(order[0].size()), made);
    std::vector<std::string> sorted = order[0];
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  }
}

}  // namespace

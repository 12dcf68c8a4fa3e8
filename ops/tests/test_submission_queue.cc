// Unit tests of the submission queue (core/submission_queue.cc): when a
// submission wakes the sleeping engine thread, and what it then takes.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/pending_op.h"
#include "core/submission_queue.h"
#include "tests/harness.h"

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<hvdkeras::PendingOp> Op(const std::string& name) {
  auto op = std::make_unique<hvdkeras::PendingOp>();
  op->request.name = name;
  return op;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(QueueTakesWhatIsQueuedWithoutWaiting) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  CHECK(queue.Submit(Op("a")).ok());
  const auto start = Clock::now();
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(true, 10000.0, 1);
  CHECK_EQ(taken.ops.size(), size_t{1});
  CHECK(SecondsSince(start) < 5.0);
}

TEST(QueueSleepsUntilTheWakeCountIsQueued) {
  // The first two submissions must not wake the thread waiting for three:
  // had they, it would take fewer than three ops.
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  std::thread submitter([&queue] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(queue.Submit(Op("a")).ok());
    CHECK(queue.Submit(Op("b")).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(queue.Submit(Op("c")).ok());
  });
  const auto start = Clock::now();
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(true, 30000.0, 3);
  submitter.join();
  CHECK_EQ(taken.ops.size(), size_t{3});
  CHECK(SecondsSince(start) < 20.0);
  CHECK_EQ(taken.ops[2]->request.name, std::string("c"));
}

TEST(QueueWakesAtTheDeadlineWithFewerOps) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  CHECK(queue.Submit(Op("a")).ok());
  const auto start = Clock::now();
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(true, 50.0, 5);
  CHECK_EQ(taken.ops.size(), size_t{1});
  CHECK(SecondsSince(start) >= 0.045);
}

TEST(QueueShutdownWakesAWaitingEngine) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  std::thread stopper([&queue] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    queue.RequestShutdown();
  });
  const auto start = Clock::now();
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(true, 60000.0, 4);
  stopper.join();
  CHECK(taken.shutdown);
  CHECK(SecondsSince(start) < 30.0);
}

TEST(QueueWakeCountOfZeroMeansOne) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  std::thread submitter([&queue] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK(queue.Submit(Op("a")).ok());
  });
  const auto start = Clock::now();
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(true, 60000.0, 0);
  submitter.join();
  CHECK_EQ(taken.ops.size(), size_t{1});
  CHECK(SecondsSince(start) < 30.0);
}

std::vector<std::unique_ptr<hvdkeras::PendingOp>> Ops(const std::vector<std::string>& names) {
  std::vector<std::unique_ptr<hvdkeras::PendingOp>> ops;
  for (const std::string& name : names) ops.push_back(Op(name));
  return ops;
}

TEST(QueueSubmitAllQueuesInOrder) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(3, "", false);
  auto ops = Ops({"a", "b", "c"});
  CHECK(queue.SubmitAll(&ops).ok());
  CHECK(ops.empty());
  hvdkeras::SubmissionQueue::Taken taken = queue.Take(false, 0.0);
  CHECK_EQ(taken.ops.size(), size_t{3});
  CHECK_EQ(taken.ops[0]->request.name, std::string("a"));
  CHECK_EQ(taken.ops[2]->request.name, std::string("c"));
  CHECK_EQ(taken.ops[1]->request.rank, 3);
  const std::string flying = queue.DescribeInFlight();  // names in no set order
  CHECK_EQ(flying.rfind("3 collective(s) (", 0), size_t{0});
  for (const char* name : {"'a'", "'b'", "'c'"}) CHECK(flying.find(name) != std::string::npos);
}

TEST(QueueSubmitAllRefusesEverythingWhenOneNameIsInFlight) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  CHECK(queue.Submit(Op("b")).ok());
  auto ops = Ops({"a", "b", "c"});
  hvdkeras::Status s = queue.SubmitAll(&ops);
  CHECK(!s.ok());
  CHECK(s.message.find("'b' is already in flight") != std::string::npos);
  CHECK_EQ(ops.size(), size_t{3});  // the caller keeps them
  // Nothing of the refused call stays in flight: "a" can be submitted.
  CHECK(queue.Submit(Op("a")).ok());
  CHECK_EQ(queue.Take(false, 0.0).ops.size(), size_t{2});  // "b", then "a"
}

TEST(QueueSubmitAllRefusesANameGivenTwice) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  auto ops = Ops({"a", "a"});
  CHECK(!queue.SubmitAll(&ops).ok());
  CHECK(queue.Submit(Op("a")).ok());
}

TEST(QueueReleasedNamesCanBeSubmittedAgain) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  for (int step = 0; step < 3; ++step) {
    CHECK(queue.Submit(Op("a")).ok());
    CHECK(!queue.Submit(Op("a")).ok());
    hvdkeras::SubmissionQueue::Taken taken = queue.Take(false, 0.0);
    CHECK_EQ(queue.DescribeInFlight(), std::string("1 collective(s) ('a')"));
    queue.Release({taken.ops[0].get()});
    CHECK_EQ(queue.DescribeInFlight(), std::string(""));
  }
  // Thousands of names used once each are forgotten along the way (swept),
  // and what is in flight is still reported exactly.
  CHECK(queue.Submit(Op("kept")).ok());
  for (int i = 0; i < 10000; ++i) {
    CHECK(queue.Submit(Op("once-" + std::to_string(i))).ok());
    hvdkeras::SubmissionQueue::Taken taken = queue.Take(false, 0.0);
    std::vector<hvdkeras::PendingOp*> done;
    for (auto& op : taken.ops) {
      if (op->request.name != "kept") done.push_back(op.get());
    }
    queue.Release(done);
  }
  CHECK_EQ(queue.DescribeInFlight(), std::string("1 collective(s) ('kept')"));
  CHECK(!queue.Submit(Op("kept")).ok());
}

TEST(QueueRecycledOpsComeBackEmptied) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  CHECK(queue.TakeSpare() == nullptr);
  auto op = Op("a");
  op->done = [](const hvdkeras::Status&) {};
  op->response = std::make_shared<hvdkeras::Response>();
  op->cache_slot = 7;
  op->sent = true;
  op->finished = true;
  op->request.splits = {1, 2};
  op->request.shapes = {{4, 5}};
  auto held = std::make_shared<int>(1);  // stands for framework state a capture owns
  op->tensors.resize(1);
  op->tensors[0].reuse_input = [held](void**) { return false; };
  hvdkeras::PendingOp* address = op.get();
  std::vector<std::unique_ptr<hvdkeras::PendingOp>> finished;
  finished.push_back(std::move(op));
  queue.Recycle(&finished);
  std::unique_ptr<hvdkeras::PendingOp> spare = queue.TakeSpare();
  CHECK(spare.get() == address);
  CHECK(!spare->done);
  CHECK(spare->response == nullptr);
  CHECK_EQ(spare->cache_slot, -1);
  CHECK(!spare->sent);
  CHECK(!spare->finished);
  CHECK(spare->request.splits.empty());
  CHECK(!spare->tensors[0].reuse_input);
  CHECK_EQ(held.use_count(), 1L);  // the recycled op let go of it
  // Shapes keep their storage for the next fill, which overwrites them.
  CHECK(spare->request.shapes[0].capacity() >= size_t{2});
  CHECK(queue.TakeSpare() == nullptr);
}

}  // namespace

TEST(ASubmissionAfterAFailedStopNamesTheError) {
  hvdkeras::SubmissionQueue queue;
  queue.Open(0, "", false);
  queue.Close("a GPU collective failed on rank 1: a reason");
  queue.Close("a later reason");  // the first one is kept
  hvdkeras::Status s = queue.Submit(Op("next"));
  CHECK(!s.ok());
  // Still a casualty's wording (Note [shutdown wording] in engine.cc).
  CHECK(s.message.find("hvdkeras has been shut down, so collective 'next' cannot run") !=
        std::string::npos);
  CHECK(s.message.find("it stopped after an error: a GPU collective failed on rank 1: a reason") !=
        std::string::npos);
  CHECK(s.message.find("a later reason") == std::string::npos);
  // An orderly end names no error, and a new start forgets the old one.
  queue.Open(0, "", false);
  queue.Close();
  s = queue.Submit(Op("after"));
  CHECK(!s.ok());
  CHECK(s.message.find("after an error") == std::string::npos);
}

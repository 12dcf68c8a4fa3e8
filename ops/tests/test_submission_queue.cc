// Unit tests of the submission queue (core/submission_queue.cc): when a
// submission wakes the sleeping engine thread, and what it then takes.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

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

}  // namespace

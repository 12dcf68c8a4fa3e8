// The watchdog: a thread of its own that bounds the waits no other part of
// hvdkeras can bound, and answers other ranks' questions about this one.
//
// Note [bounded waits]
// ~~~~~~~~~~~~~~~~~~~~
// A rank may wait on the others in three places, and each has a bound, by
// default HVDKERAS_STALL_SHUTDOWN_SECONDS (stall_shutdown_seconds; 0 turns
// all of them off):
// 1. A collective some ranks submitted and others did not: rank 0's
//    coordinator fails it on the ranks waiting in it and says where each
//    missing rank waits instead (coordinator.cc, ExplainStall). A join()
//    whose missing ranks submit nothing for twice that long fails too.
// 2. An engine thread inside one step of its cycle for that long: inside
//    negotiation or a collective's MPI calls (some rank's engine stopped
//    taking part: its process is stopped, its engine thread stuck, its host
//    unreachable) or inside the framework's completion callbacks. MPI has no
//    way to leave a collective call, so the watchdog asks every other rank
//    what it is doing (below), prints the answers and ends the job with
//    MPI_Abort.
// 3. Python's own agreements between ranks (init, process sets, GPU
//    pinning: hvdkeras/engine/agreement.py), which time out on their own and
//    raise on every rank that waited, naming the ranks that did and did not
//    arrive and, from this watchdog's answers, what the missing ones do.
// Asking: any rank may send every other rank's watchdog a question on a
// communicator of its own; a watchdog answers within a tick with what its
// process is doing (the Python activity set through the C API, and each
// engine's EngineActivity). A rank that does not answer within the wait is
// stopped, gone or unreachable. Questions need MPI_THREAD_MULTIPLE; below
// it the watchdog only bounds its own engines and nobody is asked.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/common.h"
#include "core/engine_activity.h"
#include "core/liveness.h"

namespace hvdkeras {

class Watchdog {
 public:
  static Watchdog& Instance();

  // Starts the thread on a private duplicate of `comm` (collective over it)
  // with `bound_seconds` (0: never end the job; questions still answered)
  // and host liveness bounded by `liveness_seconds` (0: off; see Note [host
  // liveness] in liveness.h).
  Status Start(MPI_Comm comm, double bound_seconds, double liveness_seconds);
  // Stops the thread and frees the communicator (local).
  void Stop();

  // Engines register once (they are never destroyed).
  void Watch(const EngineActivity* activity);

  // What this process's framework thread does ("" : its own code).
  void SetActivity(const std::string& what);

  // Asks each of `ranks` what it is doing; waits at most `wait_seconds` for
  // the answers. Rank -> answer, or "no answer within N s (...)". Any thread.
  std::map<int, std::string> Ask(const std::vector<int>& ranks, double wait_seconds);

  // This rank's own answer.
  std::string Describe();

  // Sockets this rank holds for host liveness (Note [liveness tree]).
  int LivenessSockets() const { return liveness_.sockets(); }

 private:
  void Loop();
  // Answers the questions that have arrived (any thread that polls).
  void AnswerQuestions();
  // An engine stuck past the bound: say what every rank does, end the job.
  [[noreturn]] void EndJob(const EngineActivity& stuck, double seconds);
  // Rank 0: hosts fell silent; name them and end the job.
  [[noreturn]] void EndLostHosts(const Liveness::Verdict& verdict);
  // Another rank: rank 0 fell silent; this host is the one cut off.
  [[noreturn]] void EndCutOff(double silent_seconds);
  // Whether liveness has heard nothing from `rank` for a few beats, so that
  // no MPI message may go to it (Note [host liveness]).
  bool Silent(int rank) const;

  std::mutex mu_;  // everything below but the atomics
  std::condition_variable cv_;
  bool running_ = false;
  bool stop_ = false;
  std::thread thread_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool can_ask_ = false;
  double bound_seconds_ = 0.0;
  Liveness liveness_;
  std::vector<const EngineActivity*> watched_;
  std::string activity_;
  double activity_since_ = 0.0;

  std::mutex ask_mu_;        // one question round at a time
  std::atomic<int64_t> next_question_{1};
  std::mutex send_mu_;       // the sends still in flight, and their buffers
  std::deque<std::pair<MPI_Request, std::string>> sends_;
  void Send(int to, int tag, std::string payload);
};

}  // namespace hvdkeras

#include "core/watchdog.h"

#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/liveness_start.h"

namespace hvdkeras {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kQuestionTag = 7301;
constexpr int kAnswerTag = 7302;
// Sends to a rank that never takes them (stopped, gone) are let go past this
// many, their buffers kept for good: MPI may still read them.
constexpr size_t kMaxSendsInFlight = 256;

double NowSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", s);
  return text;
}

// Takes one message with `tag` from `source` if one has arrived.
bool TakeMessage(MPI_Comm comm, int source, int tag, std::string* payload, int* from) {
  int flag = 0;
  MPI_Message message;
  MPI_Status status;
  if (MPI_Improbe(source, tag, comm, &flag, &message, &status) != MPI_SUCCESS || !flag) {
    return false;
  }
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  payload->assign(static_cast<size_t>(std::max(count, 0)), '\0');
  MPI_Mrecv(payload->data(), count, MPI_CHAR, &message, &status);
  *from = status.MPI_SOURCE;
  return true;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Writes this rank's failure record where hvdkerasrun's shim asked for it
// (HVDKERAS_FAILURE_RECORD; format: Note [failure record] in
// hvdkeras/runner/rank_shim.py), so the launcher names this rank and why.
void WriteFailureRecord(int rank, const std::string& reason, const std::string& message,
                        const std::vector<int>& silent, bool cut_off = false) {
  const char* path = std::getenv("HVDKERAS_FAILURE_RECORD");
  if (!path || !*path) return;
  const char* attempt = std::getenv("HVDKERAS_ATTEMPT");
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::string lines = "[";
  std::istringstream in(message);
  std::string line;
  for (bool first = true; std::getline(in, line); first = false) {
    lines += (first ? "" : ", ") + JsonString(line);
  }
  lines += "]";
  char now[32];
  std::snprintf(now, sizeof(now), "%.3f",
                std::chrono::duration<double>(
                    std::chrono::system_clock::now().time_since_epoch()).count());
  const std::string tmp = std::string(path) + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream out(tmp);
    out << "{\"rank\": " << JsonString(std::to_string(rank))
        << ", \"attempt\": " << (attempt && *attempt ? std::atoi(attempt) : 1)
        << ", \"exit_code\": 1, \"signal\": null, \"last_lines\": " << lines
        << ", \"time\": " << now << ", \"host\": " << JsonString(host)
        << ", \"pid\": " << getpid() << ", \"reason\": " << JsonString(reason)
        << ", \"cut_off\": " << (cut_off ? "true" : "false")
        << ", \"silent_ranks\": [";
    for (size_t i = 0; i < silent.size(); ++i) out << (i ? ", " : "") << silent[i];
    out << "]}";
  }
  std::rename(tmp.c_str(), path);
}

// Waits (at most 2 s) until whoever reads this process's stdout and stderr
// pipes took what was written, as hvdkeras/engine/failfast.py does before
// its abort: the abort kills the readers with this rank.
void WaitForReaders() {
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  for (int fd : {1, 2}) {
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISFIFO(info.st_mode)) continue;
    int unread = 0;
    while (ioctl(fd, FIONREAD, &unread) == 0 && unread > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

Watchdog& Watchdog::Instance() {
  static Watchdog* watchdog = new Watchdog();  // outlives atexit, like the engines
  return *watchdog;
}

Status Watchdog::Start(MPI_Comm comm, double bound_seconds, double liveness_seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  if (running_) return Status::OK();
  if (MPI_Comm_dup(comm, &comm_) != MPI_SUCCESS) {
    return Status::Error(StatusCode::kUnknown, "the watchdog could not duplicate its communicator");
  }
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  can_ask_ = provided == MPI_THREAD_MULTIPLE;
  bound_seconds_ = bound_seconds;
  const Status started = StartLiveness(comm_, liveness_seconds, &liveness_);
  if (!started.ok()) {
    MPI_Comm_free(&comm_);
    return started;
  }
  stop_ = false;
  running_ = true;
  activity_.clear();
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  liveness_.Stop();
  std::lock_guard<std::mutex> lock(mu_);
  {
    std::lock_guard<std::mutex> sends(send_mu_);
    for (auto& [request, buffer] : sends_) {
      MPI_Request_free(&request);
      new std::string(std::move(buffer));  // MPI may still read it: kept for good
    }
    sends_.clear();
  }
  MPI_Comm_free(&comm_);
  running_ = false;
}

void Watchdog::Watch(const EngineActivity* activity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(watched_.begin(), watched_.end(), activity) == watched_.end()) {
    watched_.push_back(activity);
  }
}

void Watchdog::SetActivity(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_ = what;
  activity_since_ = NowSeconds();
}

std::string Watchdog::Describe() {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mu_);
  out << "pid " << getpid() << " on " << host << ": ";
  if (activity_.empty()) {
    out << "main thread in its own code (no hvdkeras call of Python's in progress)";
  } else {
    out << "main thread in " << activity_ << " for " << Seconds(NowSeconds() - activity_since_)
        << " s";
  }
  for (const EngineActivity* activity : watched_) out << "; " << activity->Describe();
  return out.str();
}

void Watchdog::Send(int to, int tag, std::string payload) {
  std::lock_guard<std::mutex> lock(send_mu_);
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    MPI_Test(&it->first, &done, MPI_STATUS_IGNORE);
    it = done ? sends_.erase(it) : it + 1;
  }
  if (sends_.size() >= kMaxSendsInFlight) {
    MPI_Request_free(&sends_.front().first);
    new std::string(std::move(sends_.front().second));  // see kMaxSendsInFlight
    sends_.pop_front();
  }
  sends_.emplace_back(MPI_REQUEST_NULL, std::move(payload));
  std::string& buffer = sends_.back().second;
  MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_CHAR, to, tag, comm_,
            &sends_.back().first);
}

void Watchdog::AnswerQuestions() {
  std::string question;
  int from = 0;
  while (TakeMessage(comm_, MPI_ANY_SOURCE, kQuestionTag, &question, &from)) {
    if (!Silent(from)) Send(from, kAnswerTag, question + "\n" + Describe());
  }
}

std::map<int, std::string> Watchdog::Ask(const std::vector<int>& ranks, double wait_seconds) {
  std::map<int, std::string> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_ || !can_ask_) {
      const char* why = running_ ? "not asked (MPI runs without MPI_THREAD_MULTIPLE)"
                                 : "not asked (hvdkeras is not running on this rank)";
      for (int r : ranks) answers[r] = why;
      return answers;
    }
  }
  std::lock_guard<std::mutex> round(ask_mu_);
  const std::string id = std::to_string(next_question_++);
  std::vector<int> waiting;
  for (int r : ranks) {
    if (r == rank_) {
      answers[r] = Describe();
    } else if (Silent(r)) {
      answers[r] = "no answer: not asked, since nothing has come from its host (" +
                   liveness_.HostOf(r) + ") for " + Seconds(liveness_.SilentFor(r)) +
                   " s (its link is down, or the host or its process is gone or stopped)";
    } else if (r >= 0 && r < size_) {
      Send(r, kQuestionTag, id);
      waiting.push_back(r);
    }
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(wait_seconds));
  while (!waiting.empty() && Clock::now() < deadline) {
    AnswerQuestions();  // a rank asking at the same time waits for us too
    std::string answer;
    int from = 0;
    while (TakeMessage(comm_, MPI_ANY_SOURCE, kAnswerTag, &answer, &from)) {
      const size_t newline = answer.find('\n');
      if (answer.substr(0, newline) != id) continue;  // an earlier round's late answer
      answers[from] = newline == std::string::npos ? "" : answer.substr(newline + 1);
      waiting.erase(std::remove(waiting.begin(), waiting.end(), from), waiting.end());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r : waiting) {
    answers[r] = "no answer within " + Seconds(wait_seconds) +
                 " s (its process is stopped or gone, or its host is unreachable)";
  }
  return answers;
}

void Watchdog::Loop() {
  const double tick = bound_seconds_ > 0 ? std::clamp(bound_seconds_ / 20.0, 0.05, 0.5) : 0.2;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(tick));
    if (stop_) break;
    const std::vector<const EngineActivity*> watched = watched_;
    lock.unlock();
    if (can_ask_) AnswerQuestions();
    const Liveness::Verdict verdict = liveness_.Poll();
    if (!verdict.lost_hosts.empty()) EndLostHosts(verdict);
    if (verdict.cut_off) EndCutOff(verdict.silent_seconds);
    for (const EngineActivity* activity : watched) {
      double seconds = 0.0;
      const EngineActivity::Phase phase = activity->phase(&seconds);
      if (bound_seconds_ > 0 && phase != EngineActivity::Phase::kIdle &&
          seconds > bound_seconds_) {
        EndJob(*activity, seconds);
      }
    }
    lock.lock();
  }
}

void Watchdog::EndJob(const EngineActivity& stuck, double seconds) {
  if (rank_ != 0 && Silent(0)) EndCutOff(liveness_.SilentFor(0));
  std::ostringstream out;
  out << "hvdkeras: ERROR: rank " << rank_ << "'s engine has stayed " << Seconds(seconds)
      << " s in one step, longer than HVDKERAS_STALL_SHUTDOWN_SECONDS ("
      << Seconds(bound_seconds_) << " s): " << stuck.Describe()
      << ". Some rank's engine has stopped taking part in the collectives (its process is "
         "stopped or stuck, or its host is unreachable), or a framework callback never "
         "returned.";
  std::vector<int> others, silent;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back(r);
  }
  std::string reason = "a wait past HVDKERAS_STALL_SHUTDOWN_SECONDS";
  if (can_ask_ && !others.empty()) {
    std::ostringstream answers;
    const double wait = std::clamp(bound_seconds_ / 10.0, 1.0, 5.0);
    for (const auto& [rank, answer] : Ask(others, wait)) {
      answers << "\n  rank " << rank << ": " << answer;
      if (answer.rfind("no answer", 0) == 0) silent.push_back(rank);
    }
    if (!silent.empty()) {
      const std::string list = RankListText(silent);
      out << " Rank(s) " << list << " did not answer.";
      reason += " (rank(s) " + list + " did not answer)";
    }
    out << " What the other ranks say:" << answers.str() << "\n";
  }
  out << " Ending the whole job (MPI abort): MPI has no way out of a collective call that has "
         "started.\n";
  const std::string text = out.str();
  WriteFailureRecord(rank_, reason, text, silent);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  WaitForReaders();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; this keeps the promise if it does
}

}  // namespace hvdkeras

namespace hvdkeras {

bool Watchdog::Silent(int rank) const {
  return liveness_.SilentFor(rank) > 3 * liveness_.BeatSeconds();
}

void Watchdog::EndLostHosts(const Liveness::Verdict& verdict) {
  std::string hosts;
  for (const std::string& host : verdict.lost_hosts) hosts += (hosts.empty() ? "" : ", ") + host;
  const std::string ranks = RankListText(verdict.lost_ranks);
  const std::string reason = "lost host(s) " + hosts + ": nothing from rank(s) " + ranks +
                             " for " + Seconds(verdict.silent_seconds) + " s";
  const std::string text =
      "hvdkeras: ERROR: host(s) " + hosts + " (rank(s) " + ranks + ") sent nothing for " +
      Seconds(verdict.silent_seconds) + " s, longer than the liveness bound (" +
      Seconds(liveness_.bound_seconds()) +
      " s: HVDKERAS_LIVENESS_SECONDS, at most half of HVDKERAS_STALL_SHUTDOWN_SECONDS): the "
      "link to it is down, or the host or hvdkeras's processes on it are gone or stopped. "
      "A rank that is only slow keeps beating and is never taken for lost. Ending the whole "
      "job (MPI abort).\n";
  WriteFailureRecord(rank_, reason, text, verdict.lost_ranks);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  WaitForReaders();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

void Watchdog::EndCutOff(double silent_seconds) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const std::string root = liveness_.HostOf(0);
  const std::string reason = "cut off from rank 0's host " + root + " (nothing from it for " +
                             Seconds(silent_seconds) + " s)";
  const std::string text =
      "hvdkeras: ERROR: rank " + std::to_string(rank_) + " on " + host +
      " has heard nothing from rank 0 (on " + root + ") for " + Seconds(silent_seconds) +
      " s, longer than the liveness bound (" + Seconds(liveness_.bound_seconds()) +
      " s): this host's link is down, or rank 0's host is gone. Ending this rank without "
      "MPI (its peers cannot be reached); rank 0 ends the others.\n";
  WriteFailureRecord(rank_, reason, text, {}, /*cut_off=*/true);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  WaitForReaders();
  std::_Exit(1);
}

}  // namespace hvdkeras

// Rank 0's bookkeeping for the slow negotiation path: collects the requests
// every rank sent for a name, decides when a name is ready on all ranks
// (counting ranks that have joined as ready for everything), checks that the
// ranks agree, and finds requests that have waited too long. Pure logic with
// no MPI, so it is unit-testable.
#pragma once

#include <chrono>
#include <map>
#include <unordered_map>
#include <string>
#include <vector>

#include "core/message.h"
#include "core/request_validation.h"

namespace hvdkeras {

using SteadyClock = std::chrono::steady_clock;

// A name some ranks submitted long ago while others still have not.
struct Stall {
  std::string name;
  double seconds = 0.0;
  std::vector<int> submitted;
  std::vector<int> missing;
  // For each missing rank (same order), the names it waits in instead,
  // oldest first (at most a few): what the coordinator has from that rank
  // that the other ranks never matched.
  std::vector<std::vector<std::string>> waiting_instead;
};

// What a stall means in words a user can act on: which collective each
// missing rank waits in instead (the program diverged), or that it waits in
// none (it runs its own code, hangs, or finished early). Starts with ". ".
std::string ExplainStall(const Stall& stall);

class Coordinator {
 public:
  explicit Coordinator(int size);

  // Records one rank's request. A name becomes ready when every rank has
  // sent it or joined; ready names queue up in the order they became ready.
  void Add(const Request& request, SteadyClock::time_point now = SteadyClock::now());

  // Note [requests by signature hash] (request_digest.h): whether a pending
  // name holds a request with this signature hash, and the full request
  // behind a known hash (valid until the next Add).
  bool Known(uint64_t hash) const { return index_.count(hash) > 0; }
  const Request& Signature(uint64_t hash) const;
  // Records rank `rank`'s request from a digest: `signature` (whose hash is
  // `hash`; any rank's request of that signature) with this rank's age and
  // own numbers (as AppendPerRankNumbers writes them).
  void AddDigest(const Request& signature, uint64_t hash, int rank, double age_seconds,
                 const int64_t* numbers, size_t count,
                 SteadyClock::time_point now = SteadyClock::now());

  // Responses for names that became ready since the last call, in order.
  std::vector<Response> TakeReady();
  // When each rank submitted the names returned by the last TakeReady()
  // (for the timeline; indexed by rank, unset for ranks that had joined).
  const std::map<std::string, std::vector<SteadyClock::time_point>>& ready_times() const {
    return ready_times_;
  }
  bool has_ready() const { return !ready_.empty(); }

  bool any_joined() const { return joined_count_ > 0; }
  size_t pending_count() const { return table_.size(); }
  // The bytes the pending names' tables hold (counted from their sizes, not
  // measured from the allocator): what grows with the rank count here.
  int64_t TableBytes() const { return table_bytes_; }
  int64_t PeakTableBytes() const { return peak_table_bytes_; }

  // Names waiting longer than `seconds` for some rank. Each name is
  // reported once per call that finds it over the limit and not reported
  // before (set `only_new` to false to report all). A join counts only once
  // the ranks that have not joined have also sent nothing for 2 * `seconds`.
  std::vector<Stall> FindStalls(SteadyClock::time_point now, double seconds, bool only_new = true);

  // Whether FailStalled(now, seconds) would fail something.
  bool AnyStalled(SteadyClock::time_point now, double seconds) const;

  // Turns every name waiting longer than `seconds` into an error response
  // (queued like a ready one), so the ranks that submitted it fail instead of
  // waiting forever. Call it after adding the cycle's requests (Note
  // [stall shutdown after the cycle's requests] in negotiation.cc).
  void FailStalled(SteadyClock::time_point now, double seconds);

 private:
  // One name's requests so far.
  //
  // Note [one reference request per name]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // The ranks of a data-parallel job almost always send the same request,
  // so an entry keeps one of them (`reference`), the few per-rank numbers
  // that may differ (an allgather's or alltoall's first dimensions,
  // alltoall's splits) and, apart, only the requests that differ from the
  // reference in anything else (`odd`). What rank r sent is Sent(entry, r).
  // Readiness is a count, so adding a request costs the same at 4 ranks as
  // at 16,384, and a name waiting on 16,384 ranks holds one request, not
  // 16,384. Validation over the one reference finds what it would over all
  // (BuildResponse); the unit test at 16,384 ranks checks the answers.
  struct Entry {
    Request reference;  // the first to arrive; its rank field is not meaningful
    uint64_t reference_hash = 0;
    std::map<int, Request> odd;
    std::map<uint64_t, Request> odd_signatures;  // one request per odd hash
    int tensors = 0;                 // the reference's tensor count
    std::vector<int64_t> first_dims;  // allgather, alltoall: [rank * tensors + t]
    std::vector<int64_t> splits;      // alltoall: [rank * size + destination]
    std::vector<bool> seen;
    std::vector<SteadyClock::time_point> submitted_at;
    int received = 0;
    int joined_seen = 0;  // ranks that both sent this and have joined
    int lowest_rank = -1;
    SteadyClock::time_point first_seen;
    uint64_t sequence = 0;
    bool warned = false;
    int64_t bytes = 0;  // what TableBytes counts for it
  };

  // The request rank `rank` sent for the entry (it must have sent one).
  Request Sent(const Entry& entry, int rank) const;
  const Request& SignatureIn(const Entry& entry, uint64_t hash) const;
  void Record(Entry& entry, const Request& signature, uint64_t hash, int rank, double age_seconds,
              const int64_t* numbers, size_t count);
  void Erase(const std::string& name);
  void CountBytes(Entry& entry, int64_t more);
  bool IsReady(const Entry& entry) const;
  bool Stalled(const Entry& entry, SteadyClock::time_point now, double seconds) const;
  // The names `rank` has waiting here, other than `except`, oldest first.
  std::vector<std::string> WaitingOn(int rank, const std::string& except) const;
  bool IsJoin(const Entry& entry) const;
  Response BuildResponse(const Entry& entry) const;
  void Join(int rank);
  void ForgetJoins();
  void PromoteReady();

  int size_;
  std::map<std::string, Entry> table_;
  std::unordered_map<uint64_t, Entry*> index_;  // signature hash -> its pending entry
  int64_t table_bytes_ = 0, peak_table_bytes_ = 0;
  // When each rank last sent a request, or when this coordinator started (a
  // join waits only while the ranks that have not joined keep submitting).
  std::vector<SteadyClock::time_point> last_request_;
  void Complete(const std::string& name);

  std::vector<Response> ready_;
  std::map<std::string, std::vector<SteadyClock::time_point>> pending_times_, ready_times_;
  std::vector<bool> joined_;
  std::vector<int> join_order_;
  int joined_count_ = 0;
  uint64_t next_sequence_ = 0;
};

}  // namespace hvdkeras

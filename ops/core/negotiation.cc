#include "core/negotiation.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "core/scaling.h"

namespace hvdkeras {

namespace {

using Clock = std::chrono::steady_clock;

// Note [inverted status bits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Word 0 of the fast path's vector holds status bits stored inverted
// (1 = "no"), so that the bitwise AND across ranks answers "does any rank
// ...". Every rank starts from all of them set and clears the ones that are
// true for it; a bit only rank 0 can clear ("only rank 0") still starts set
// on the others.
constexpr uint64_t kNoUnsentRequests = 1;
constexpr uint64_t kNoShutdownRequest = 2;
constexpr uint64_t kNoJoinedRank = 4;
constexpr uint64_t kNoTimeline = 8;          // only rank 0
constexpr uint64_t kNoCoordinatorNews = 16;  // only rank 0
constexpr uint64_t kNoParamUpdate = 32;      // only rank 0
constexpr uint64_t kNoDeviceFailure = 64;
constexpr uint64_t kAllStatusBits = kNoUnsentRequests | kNoShutdownRequest | kNoJoinedRank |
                                    kNoTimeline | kNoCoordinatorNews | kNoParamUpdate |
                                    kNoDeviceFailure;

// Each rank's GPU failure travels in a record of this size.
constexpr int kFailureRecordBytes = 512;

bool BitSet(const std::vector<uint64_t>& bits, size_t word, size_t bit) {
  return bits[word + bit / 64] & (uint64_t{1} << (bit % 64));
}

}  // namespace

void Negotiator::Reset(NegotiationTransport* transport, const EngineConfig& config) {
  timed_.Wrap(transport);
  transport_ = &timed_;
  stall_check_seconds_ = config.stall_check_seconds;
  stall_shutdown_seconds_ = config.stall_shutdown_seconds;
  cache_ = ResponseCache(static_cast<size_t>(std::max<int64_t>(0, config.cache_capacity)));
  coordinator_.reset(transport->rank() == 0 ? new Coordinator(transport->size()) : nullptr);
  invalid_slots_.clear();
  stand_ins_.clear();
  joined_ = false;
  stall_due_ = false;
  counts_ = NegotiationCounts();
  last_stall_check_ = Clock::now();
}

void Negotiator::NoteSubmitted(const PendingOp& op) {
  if (op.request.op_type == OpType::kJoin) joined_ = true;
}

Agreement Negotiator::Negotiate(const PendingOps& pending, const CycleSignals& signals,
                                Clock::time_point now) {
  // This cycle's CPU outside the exchanges, on every way out.
  struct OwnCpu {
    OwnCpu(NegotiationCounts* c, const CpuTimedTransport* t)
        : counts(c), timed(t), start(ThreadCpuNanoseconds()), inside(t->nanoseconds_inside()) {}
    ~OwnCpu() {
      counts->own_cpu_ns +=
          ThreadCpuNanoseconds() - start - (timed->nanoseconds_inside() - inside);
    }
    NegotiationCounts* counts;
    const CpuTimedTransport* timed;
    int64_t start, inside;
  } own_cpu(&counts_, &timed_);
  Agreement agreement;
  Classify(pending, now);
  // [status | cache hits | cache entries not invalidated], ANDed across ranks.
  // See Note [inverted status bits].
  const size_t words = (cache_.num_slots() + 63) / 64;
  std::vector<uint64_t> bits(1 + 2 * words, 0);
  const size_t hits = 1, valid = 1 + words;
  bits[0] = kAllStatusBits;
  if (signals.shutdown) bits[0] &= ~kNoShutdownRequest;
  if (joined_) bits[0] &= ~kNoJoinedRank;
  if (signals.tracing) bits[0] &= ~kNoTimeline;
  if (coordinator_ && (coordinator_->has_ready() || stall_due_)) bits[0] &= ~kNoCoordinatorNews;
  if (signals.params_changed) bits[0] &= ~kNoParamUpdate;
  if (!signals.device_failure.empty()) bits[0] &= ~kNoDeviceFailure;
  for (size_t w = 0; w < words; ++w) bits[valid + w] = ~uint64_t{0};
  for (const auto& op : pending.all()) {
    if (op->sent) continue;
    if (op->cache_slot >= 0) {
      bits[hits + op->cache_slot / 64] |= uint64_t{1} << (op->cache_slot % 64);
    } else {
      bits[0] &= ~kNoUnsentRequests;
    }
  }
  for (uint64_t slot : invalid_slots_) {
    bits[valid + slot / 64] &= ~(uint64_t{1} << (slot % 64));
  }
  agreement.error = transport_->AllreduceAnd(&bits, signals.health);
  if (!agreement.error.ok()) return agreement;
  if (!(bits[0] & kNoDeviceFailure)) {
    // Every rank saw the bit, so every rank makes this exchange.
    agreement.device_failure = GatherDeviceFailures(signals.device_failure);
    return agreement;
  }
  if (!(bits[0] & kNoShutdownRequest)) {
    agreement.shutdown = true;  // every rank leaves its loop here, together
    return agreement;
  }
  agreement.params_update = !(bits[0] & kNoParamUpdate);
  agreement.tracing = !(bits[0] & kNoTimeline);
  const bool joined_anywhere = !(bits[0] & kNoJoinedRank);

  // Entries some rank found stale are dropped everywhere; local ops that
  // announced them go to the coordinator instead. While any rank has joined,
  // everything goes through the coordinator, which knows who joined.
  bool any_invalidated = false;
  for (size_t slot = 0; slot < words * 64; ++slot) {
    if (BitSet(bits, valid, slot)) continue;
    any_invalidated = true;
    bits[hits + slot / 64] &= ~(uint64_t{1} << (slot % 64));
    if (slot < cache_.num_slots()) cache_.Erase(static_cast<int>(slot));
  }
  // The agreed hits, in slot order (the same on every rank). An op whose
  // bit some rank has not set yet keeps its slot for the next cycle; one
  // whose entry was just erased goes to the coordinator.
  std::vector<std::pair<int, PendingOp*>> by_slot;
  for (const auto& op : pending.all()) {
    if (op->sent || op->cache_slot < 0) continue;
    if (joined_anywhere || (any_invalidated && !cache_.Unchanged(op->cache_slot,
                                                                 op->slot_version))) {
      op->cache_slot = -1;
    } else if (BitSet(bits, hits, static_cast<size_t>(op->cache_slot))) {
      by_slot.emplace_back(op->cache_slot, op.get());
    }
  }
  std::sort(by_slot.begin(), by_slot.end());
  for (const auto& [slot, op] : by_slot) {
    op->response = cache_.SharedResponse(slot);
    agreement.ready.push_back(op);
  }
  agreement.cached_count = agreement.ready.size();

  if (!(bits[0] & kNoUnsentRequests) || !(bits[0] & kNoCoordinatorNews) || any_invalidated ||
      joined_anywhere) {
    SlowPath(pending, joined_anywhere, &agreement);
    if (!agreement.error.ok()) return agreement;
  }

  // See Note [identical response caches]: touch what hit, then add what the
  // coordinator approved, both in execution order. Nothing is added while a
  // rank has joined (its stand-ins have no requests of their own).
  if (!joined_anywhere) {
    for (size_t i = 0; i < agreement.ready.size(); ++i) {
      PendingOp* op = agreement.ready[i];
      if (i < agreement.cached_count) {
        cache_.Touch(op->cache_slot);
      } else if (op->request.op_type != OpType::kJoin) {
        cache_.Put(op->request, op->response);
      }
    }
  }
  CountCycle(agreement);
  return agreement;
}

void Negotiator::CountCycle(const Agreement& agreement) {
  ++counts_.cycles;
  counts_.cached_ops += static_cast<int64_t>(agreement.cached_count);
  counts_.negotiated_ops += static_cast<int64_t>(agreement.ready.size() - agreement.cached_count);
  const int64_t evictions = static_cast<int64_t>(cache_.evictions());
  if (evictions > 0 && counts_.evictions == 0 && transport_->rank() == 0) {
    // Every rank's cache evicts the same entries (Note [identical response
    // caches]), so one rank says it.
    std::fprintf(stderr,
                 "hvdkeras: warning: the response cache is full (%zu entries, "
                 "HVDKERAS_CACHE_CAPACITY): this job runs more distinct collectives than it "
                 "holds, so the ones evicted are negotiated through rank 0 again each time they "
                 "recur. Raise HVDKERAS_CACHE_CAPACITY above the number of collectives a step "
                 "runs to keep every step on the one-allreduce path.\n",
                 cache_.capacity());
  }
  counts_.evictions = evictions;
}

std::string Negotiator::GatherDeviceFailures(const std::string& mine) {
  std::vector<char> record(mine.begin(), mine.begin() + std::min<size_t>(mine.size(),
                                                                        kFailureRecordBytes - 1));
  record.resize(kFailureRecordBytes, '\0');
  const int size = transport_->size();
  std::vector<char> all;
  if (!transport_->Allgather(record, &all).ok()) {
    return "a GPU collective failed on some rank (their reasons could not be gathered)";
  }
  std::vector<int> failed;
  std::string reasons;
  for (int r = 0; r < size; ++r) {
    const char* text = all.data() + static_cast<size_t>(r) * kFailureRecordBytes;
    const size_t length = strnlen(text, kFailureRecordBytes);
    if (length == 0) continue;
    failed.push_back(r);
    reasons += "; rank " + std::to_string(r) + ": " + std::string(text, length);
  }
  const std::string ranks = RankListText(failed);
  return "a GPU collective failed on rank" + std::string(failed.size() > 1 ? "s " : " ") + ranks +
         ", whose GPU communicator then fell out of step with the others', so every rank "
         "stopped and aborted its own" + reasons;
}

void Negotiator::Classify(const PendingOps& pending, Clock::time_point now) {
  invalid_slots_.clear();
  // An op that waits on the fast path for long is moved to the coordinator,
  // which is the only place that can tell which ranks are missing.
  double demote_after = 0.0;
  for (double limit : {stall_check_seconds_, stall_shutdown_seconds_}) {
    if (limit > 0) demote_after = demote_after > 0 ? std::min(demote_after, limit) : limit;
  }
  demote_after *= 0.25;
  // Note [classified once]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // Ranks hand a step's ops over out of step with each other, so an op can
  // wait several cycles for its bit on the others; looking its name up and
  // comparing its signature again each cycle would make the steady step's
  // CPU grow with the cycles it takes. An op keeps the slot it found while
  // that slot's version (ResponseCache::Version) is unchanged: nothing can
  // put another entry in it or erase it without changing the version, so
  // the slot still means this op's entry on every rank (Note [identical
  // response caches]).
  // Only an op with a slot persists past a cycle: one without goes to the
  // coordinator in the cycle it was classified.
  const std::chrono::duration<double> demote_wait(demote_after);
  for (const auto& op : pending.all()) {
    if (op->sent) continue;
    if (joined_ || op->request.op_type == OpType::kJoin) {
      op->cache_slot = -1;
      continue;
    }
    if (!cache_.Unchanged(op->cache_slot, op->slot_version)) {
      op->cache_slot = -1;
      const int slot = cache_.Lookup(op->request.name);
      if (slot < 0) continue;
      if (!cache_.Signature(slot).SameSignature(op->request)) {
        invalid_slots_.push_back(static_cast<uint64_t>(slot));
        continue;
      }
      op->cache_slot = slot;
      op->slot_version = cache_.Version(slot);
    }
    if (demote_after > 0 && now - op->enqueued > demote_wait) {
      invalid_slots_.push_back(static_cast<uint64_t>(op->cache_slot));
      op->cache_slot = -1;
    }
  }
}

void Negotiator::SlowPath(const PendingOps& pending, bool joined_anywhere,
                          Agreement* agreement) {
  const auto now = Clock::now();
  std::vector<Request> mine;
  for (const auto& op : pending.all()) {
    if (op->sent || op->cache_slot >= 0) continue;
    op->sent = true;
    op->request.age_seconds = std::chrono::duration<double>(now - op->enqueued).count();
    mine.push_back(op->request);
  }
  SendRequests(mine, now);
  std::string reply;
  if (coordinator_) {
    // Note [stall shutdown after the cycle's requests]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // Stalled names fail only after this cycle's requests were added. Failed
    // earlier, a request for the same name arriving in this cycle would open
    // a new entry while the error fails that rank's op too; the entry would
    // outlive its op, and the next time another rank submits the name the
    // coordinator would call it ready on a rank that no longer has it: one
    // rank inside the collective's MPI calls, the other never coming.
    if (stall_due_) coordinator_->FailStalled(now, stall_shutdown_seconds_);
    stall_due_ = false;
    reply = EncodeResponses(coordinator_->TakeReady());
  }
  transport_->BroadcastFromRoot(&reply);

  std::vector<Response> responses;
  DecodeResponses(reply.data(), reply.size(), &responses);
  for (Response& response : responses) {
    PendingOp* op = pending.Find(response.name);
    if (response.kind == Response::Kind::kError) {
      if (op) {
        if (op->request.op_type == OpType::kJoin) joined_ = false;  // its join failed
        agreement->failed.emplace_back(
            op, Status::Error(StatusCode::kPreconditionError, response.error));
      }
      continue;
    }
    if (response.agreed.op_type == OpType::kJoin) joined_ = false;
    if (op && !AgreesWith(op->request, response.agreed)) {
      // Only a collision of signature hashes gets here (Note [requests by
      // signature hash]): end this engine loudly rather than run a
      // collective the others run with other shapes.
      agreement->error = Status::Error(
          StatusCode::kUnknown, "internal error: rank " + std::to_string(transport_->rank()) +
                                    " was told collective '" + response.name +
                                    "' was agreed as something other than it submitted "
                                    "(a collision of request hashes)");
      return;
    }
    if (!op && joined_anywhere) op = StandIn(response);
    if (!op) {
      // Every rank sent a request for the name, so every rank holds the op
      // until an answer comes: this one cannot have lost it. If it ever
      // did, the others would wait in the collective for this rank, so end
      // this engine loudly instead (the others' watchdogs end the job).
      agreement->error = Status::Error(
          StatusCode::kUnknown, "internal error: rank " + std::to_string(transport_->rank()) +
                                    " was told that collective '" + response.name +
                                    "' is ready, but has no such collective in flight");
      return;
    }
    op->response = std::make_shared<const Response>(std::move(response));
    agreement->ready.push_back(op);
  }
}

PendingOp* Negotiator::StandIn(const Response& response) {
  // This rank has joined: take part with a neutral contribution (no rows for
  // gathers, zeros for sums, the identity for min/max/product) and discard
  // the result.
  auto op = std::make_unique<PendingOp>();
  op->request = response.agreed;
  op->request.rank = transport_->rank();
  const OpType type = response.agreed.op_type;
  for (size_t t = 0; t < response.agreed.shapes.size(); ++t) {
    TensorRef ref;
    ref.dtype = response.agreed.dtypes[t];
    ref.shape = response.agreed.shapes[t];
    if (type == OpType::kAllgather || type == OpType::kAlltoall) ref.shape[0] = 0;
    const int64_t bytes = NumElements(ref.shape) * static_cast<int64_t>(DataTypeSize(ref.dtype));
    op->scratch.emplace_back(std::max<int64_t>(bytes, 1));
    FillNeutral(ref.dtype, response.agreed.reduce_op, op->scratch.back().data(),
                NumElements(ref.shape));
    ref.input = op->scratch.back().data();
    ref.output = op->scratch.back().data();
    ref.neutral = true;
    PendingOp* owner = op.get();
    ref.allocate_output = [owner](const Shape& shape, void** data) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      owner->scratch.emplace_back(std::max<int64_t>(n * 8, 1));
      *data = owner->scratch.back().data();
      return Status::OK();
    };
    op->tensors.push_back(std::move(ref));
  }
  if (type == OpType::kAlltoall) op->request.splits.assign(transport_->size(), 0);
  stand_ins_.push_back(std::move(op));
  return stand_ins_.back().get();
}

void Negotiator::RecordTimeline(const Agreement& agreement, Timeline* timeline) {
  if (!agreement.tracing) return;
  // Rank 0 learns when every rank became ready: from the coordinator for
  // negotiated ops, from one gather of wait times for cached ones.
  const std::vector<PendingOp*>& ready = agreement.ready;
  const size_t cached_count = agreement.cached_count;
  const int size = transport_->size();
  const auto now = Clock::now();
  std::vector<double> ages(cached_count);
  for (size_t i = 0; i < cached_count; ++i) {
    ages[i] = std::chrono::duration<double>(now - ready[i]->enqueued).count();
  }
  std::vector<double> all_ages;
  transport_->GatherDoublesAtRoot(ages, &all_ages);
  if (!timeline->active()) return;
  for (size_t i = 0; i < ready.size(); ++i) {
    const Request& r = ready[i]->request;
    std::vector<Clock::time_point> times(size, now);
    if (i < cached_count) {
      for (int rank = 0; rank < size; ++rank) {
        times[rank] = now - std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(all_ages[rank * cached_count + i]));
      }
    } else {
      auto it = coordinator_->ready_times().find(r.name);
      if (it != coordinator_->ready_times().end()) times = it->second;
    }
    Clock::time_point first = now;
    for (int rank = 0; rank < size; ++rank) {
      if (times[rank] != Clock::time_point()) first = std::min(first, times[rank]);
    }
    timeline->NegotiateStart(r.name, r.op_type, first);
    for (int rank = 0; rank < size; ++rank) {
      if (times[rank] != Clock::time_point()) timeline->RankReady(r.name, rank, times[rank]);
    }
    timeline->NegotiateEnd(r.name, now);
  }
}

void Negotiator::InspectStalls(Clock::time_point now) {
  if (!coordinator_) return;
  if (now - last_stall_check_ < std::chrono::milliseconds(200)) return;
  last_stall_check_ = now;
  if (stall_check_seconds_ > 0) {
    for (const Stall& stall : coordinator_->FindStalls(now, stall_check_seconds_)) {
      std::ostringstream missing, submitted;
      for (size_t i = 0; i < stall.missing.size(); ++i) missing << (i ? ", " : "") << stall.missing[i];
      for (size_t i = 0; i < stall.submitted.size(); ++i) {
        submitted << (i ? ", " : "") << stall.submitted[i];
      }
      std::fprintf(stderr,
                   "hvdkeras: WARNING: collective '%s' has waited %.1f s: rank(s) %s have not "
                   "submitted it (rank(s) %s have)%s.\n",
                   stall.name.c_str(), stall.seconds, missing.str().c_str(),
                   submitted.str().c_str(), ExplainStall(stall).c_str());
    }
  }
  // Failed in the next slow path, after its requests (Note [stall shutdown
  // after the cycle's requests]).
  if (stall_shutdown_seconds_ > 0 && coordinator_->AnyStalled(now, stall_shutdown_seconds_)) {
    stall_due_ = true;
  }
}

}  // namespace hvdkeras

#include "core/coordinator.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/request_digest.h"

namespace hvdkeras {

Coordinator::Coordinator(int size)
    : size_(size), last_request_(size, SteadyClock::now()), joined_(size, false) {}

bool Coordinator::IsReady(const Entry& entry) const {
  // Every rank has sent the name or joined: those seen, plus those joined
  // that were not seen.
  return entry.received > 0 && entry.received + joined_count_ - entry.joined_seen == size_;
}

void Coordinator::CountBytes(Entry& entry, int64_t more) {
  entry.bytes += more;
  table_bytes_ += more;
  peak_table_bytes_ = std::max(peak_table_bytes_, table_bytes_);
}

void Coordinator::Record(Entry& entry, const Request& signature, uint64_t hash, int rank,
                         double age_seconds, const int64_t* numbers, size_t count) {
  if (entry.received == 0) {
    entry.reference = signature;
    entry.reference_hash = hash;
    index_[hash] = &entry;
    entry.tensors = static_cast<int>(signature.shapes.size());
    if (FirstDimMayDiffer(signature.op_type)) {
      entry.first_dims.assign(static_cast<size_t>(size_) * entry.tensors, 0);
    }
    if (signature.op_type == OpType::kAlltoall) {
      entry.splits.assign(static_cast<size_t>(size_) * signature.splits.size(), 0);
    }
    CountBytes(entry, static_cast<int64_t>(
                          sizeof(Entry) + entry.reference.name.size() + entry.seen.size() / 8 +
                          entry.submitted_at.size() * sizeof(SteadyClock::time_point) +
                          (entry.first_dims.size() + entry.splits.size()) * 8));
  }
  entry.odd.erase(rank);
  if (hash != entry.reference_hash) {
    // Differs in more than its own numbers: kept whole; validation will
    // say what differs.
    if (entry.odd_signatures.emplace(hash, signature).second) index_[hash] = &entry;
    entry.odd[rank] = WithPerRankNumbers(signature, rank, age_seconds, numbers, count);
    CountBytes(entry, static_cast<int64_t>(sizeof(Request) + 64));
    return;
  }
  size_t i = 0;
  if (!entry.first_dims.empty()) {
    for (int t = 0; t < entry.tensors && i < count; ++t, ++i) {
      entry.first_dims[static_cast<size_t>(rank) * entry.tensors + t] = numbers[i];
    }
  }
  if (!entry.splits.empty()) {
    const size_t n = entry.reference.splits.size();
    for (size_t k = 0; k < n && i < count; ++k, ++i) {
      entry.splits[static_cast<size_t>(rank) * n + k] = numbers[i];
    }
  }
}

Request Coordinator::Sent(const Entry& entry, int rank) const {
  auto odd = entry.odd.find(rank);
  if (odd != entry.odd.end()) return odd->second;
  Request request = entry.reference;
  request.rank = rank;
  if (!entry.first_dims.empty()) {
    for (int t = 0; t < entry.tensors; ++t) {
      if (!request.shapes[t].empty()) {
        request.shapes[t][0] = entry.first_dims[static_cast<size_t>(rank) * entry.tensors + t];
      }
    }
  }
  if (!entry.splits.empty()) {
    const size_t n = request.splits.size();
    std::copy(entry.splits.begin() + rank * n, entry.splits.begin() + (rank + 1) * n,
              request.splits.begin());
  }
  return request;
}

Response Coordinator::BuildResponse(const Entry& entry) const {
  Response response;
  response.agreed = Sent(entry, entry.lowest_rank);
  response.name = response.agreed.name;
  // When every rank sent the reference, the one request stands for all of
  // them: ValidateRequests finds the same over one as over all. Alltoall's
  // splits are checked rank by rank, and odd requests need every rank's
  // words, so those take the long way.
  std::vector<Request> submitted;
  if (entry.odd.empty() && entry.reference.op_type != OpType::kAlltoall) {
    submitted.push_back(response.agreed);
  } else {
    for (int r = 0; r < size_; ++r) {
      if (entry.seen[r]) submitted.push_back(Sent(entry, r));
    }
  }
  std::string error = ValidateRequests(submitted, size_, joined_);
  if (!error.empty()) {
    response.kind = Response::Kind::kError;
    response.error = std::move(error);
    return response;
  }
  const Request& agreed = response.agreed;
  if (agreed.op_type == OpType::kAllgather) {
    response.sizes.assign(agreed.shapes.size() * size_, 0);
    for (size_t t = 0; t < agreed.shapes.size(); ++t) {
      for (int r = 0; r < size_; ++r) {
        if (!entry.seen[r]) continue;
        auto odd = entry.odd.find(r);
        response.sizes[t * size_ + r] = odd != entry.odd.end()
                                            ? odd->second.shapes[t][0]
                                            : entry.first_dims[r * entry.tensors + t];
      }
    }
  } else if (agreed.op_type == OpType::kAlltoall) {
    response.sizes.assign(static_cast<size_t>(size_) * size_, 0);
    for (const Request& sent : submitted) {
      std::copy(sent.splits.begin(), sent.splits.end(),
                response.sizes.begin() + static_cast<size_t>(sent.rank) * size_);
    }
  } else if (agreed.op_type == OpType::kJoin) {
    response.last_joined_rank = join_order_.empty() ? -1 : join_order_.back();
  }
  return response;
}

void Coordinator::Add(const Request& request, SteadyClock::time_point now) {
  std::vector<int64_t> numbers;
  AppendPerRankNumbers(request, &numbers);
  AddDigest(request, SignatureHash(request), request.rank, request.age_seconds, numbers.data(),
            numbers.size(), now);
}

const Request& Coordinator::SignatureIn(const Entry& entry, uint64_t hash) const {
  return hash == entry.reference_hash ? entry.reference : entry.odd_signatures.at(hash);
}

const Request& Coordinator::Signature(uint64_t hash) const {
  return SignatureIn(*index_.at(hash), hash);
}

void Coordinator::AddDigest(const Request& signature, uint64_t hash, int rank,
                            double age_seconds, const int64_t* numbers, size_t count,
                            SteadyClock::time_point now) {
  if (rank < 0 || rank >= size_) return;  // not from this world
  // A known hash finds its entry without comparing names.
  auto known = index_.find(hash);
  Entry& entry = known != index_.end() ? *known->second : table_[signature.name];
  // Read before the entry changes: `signature` may be the entry's own.
  const OpType op_type = signature.op_type;
  if (entry.seen.empty()) {
    entry.seen.assign(size_, false);
    entry.submitted_at.resize(size_);
    entry.sequence = next_sequence_++;
    entry.first_seen = now;
  }
  const auto submitted_at =
      now - std::chrono::duration_cast<SteadyClock::duration>(
                std::chrono::duration<double>(age_seconds));
  entry.first_seen = std::min(entry.first_seen, submitted_at);
  entry.submitted_at[rank] = submitted_at;
  last_request_[rank] = std::max(last_request_[rank], now);
  Record(entry, signature, hash, rank, age_seconds, numbers, count);
  if (!entry.seen[rank]) {
    ++entry.received;
    if (joined_[rank]) ++entry.joined_seen;
    if (entry.lowest_rank < 0 || rank < entry.lowest_rank) entry.lowest_rank = rank;
  }
  entry.seen[rank] = true;
  if (op_type == OpType::kJoin) {
    Join(rank);  // may complete other names as well
  } else if (IsReady(entry)) {
    Complete(entry.reference.name);
  }
}

void Coordinator::Erase(const std::string& name) {
  auto it = table_.find(name);
  if (it == table_.end()) return;
  index_.erase(it->second.reference_hash);
  for (const auto& [hash, request] : it->second.odd_signatures) index_.erase(hash);
  table_bytes_ -= it->second.bytes;
  table_.erase(it);
}

void Coordinator::Complete(const std::string& entry_name) {
  const std::string name = entry_name;  // it may be the entry's own, which goes below
  const Entry& entry = table_[name];
  ready_.push_back(BuildResponse(entry));
  pending_times_[name] = entry.submitted_at;
  Erase(name);
}

void Coordinator::Join(int rank) {
  if (!joined_[rank]) {
    joined_[rank] = true;
    ++joined_count_;
    join_order_.push_back(rank);
    for (auto& [name, entry] : table_) {
      if (entry.seen[rank]) ++entry.joined_seen;
    }
  }
  PromoteReady();
}

void Coordinator::ForgetJoins() {
  joined_.assign(size_, false);  // the ranks that joined are ranks again
  joined_count_ = 0;
  join_order_.clear();
  for (auto& [name, entry] : table_) entry.joined_seen = 0;
}

bool Coordinator::IsJoin(const Entry& entry) const {
  // Waiting in join() for slower ranks is the point of join, not a stall.
  return entry.received > 0 && entry.reference.op_type == OpType::kJoin;
}

void Coordinator::PromoteReady() {
  // Names that only waited for ranks that have now joined are ready; the
  // join itself completes last, once every rank has joined.
  std::vector<std::pair<uint64_t, std::string>> ready_names;
  std::string join_name;
  for (const auto& [name, entry] : table_) {
    if (!IsReady(entry)) continue;
    if (IsJoin(entry)) {
      if (joined_count_ == size_) join_name = name;
    } else {
      ready_names.emplace_back(entry.sequence, name);
    }
  }
  std::sort(ready_names.begin(), ready_names.end());
  for (const auto& item : ready_names) Complete(item.second);
  if (!join_name.empty()) {
    Complete(join_name);
    ForgetJoins();
  }
}

std::vector<Response> Coordinator::TakeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  ready_times_.swap(pending_times_);
  pending_times_.clear();
  return out;
}

std::string ExplainStall(const Stall& stall) {
  std::ostringstream out;
  std::vector<int> idle;
  bool diverged = false;
  for (size_t i = 0; i < stall.missing.size(); ++i) {
    const std::vector<std::string> names =
        i < stall.waiting_instead.size() ? stall.waiting_instead[i] : std::vector<std::string>{};
    if (names.empty()) {
      idle.push_back(stall.missing[i]);
      continue;
    }
    diverged = true;
    out << ". Meanwhile rank " << stall.missing[i] << " waits in ";
    for (size_t k = 0; k < names.size(); ++k) out << (k ? ", " : "") << "'" << names[k] << "'";
    out << " instead";
  }
  if (diverged) {
    out << ": the ranks are running different collectives, so the program diverged (a rank "
           "skipped, added or reordered a collective, or caught an error and went on)";
  }
  if (!idle.empty()) {
    out << ". Rank(s) " << RankListText(idle)
        << " wait in no collective: they run their own code (a longer loop, a step only they "
           "take), are stuck, or have finished";
  }
  return out.str();
}

std::vector<std::string> Coordinator::WaitingOn(int rank, const std::string& except) const {
  constexpr size_t kMaxNames = 3;
  std::vector<std::pair<SteadyClock::time_point, std::string>> found;
  for (const auto& [name, entry] : table_) {
    if (name != except && entry.seen[rank]) found.emplace_back(entry.submitted_at[rank], name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (size_t i = 0; i < found.size() && i < kMaxNames; ++i) names.push_back(found[i].second);
  return names;
}

bool Coordinator::Stalled(const Entry& entry, SteadyClock::time_point now,
                          double seconds) const {
  const auto limit = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(seconds));
  if (now - entry.first_seen < limit) return false;
  if (!IsJoin(entry)) return true;
  // Waiting in join() for slower ranks is its point; it stalls only when
  // the ranks still missing have gone quiet as well, for twice the bound:
  // a missing rank may be waiting out a stall of its own in a process set,
  // whose collectives this coordinator does not see, and join after it.
  for (int r = 0; r < size_; ++r) {
    if (!joined_[r] && now - last_request_[r] < 2 * limit) return false;
  }
  return true;
}

bool Coordinator::AnyStalled(SteadyClock::time_point now, double seconds) const {
  for (const auto& [name, entry] : table_) {
    if (Stalled(entry, now, seconds)) return true;
  }
  return false;
}

std::vector<Stall> Coordinator::FindStalls(SteadyClock::time_point now, double seconds,
                                           bool only_new) {
  std::vector<Stall> stalls;
  for (auto& [name, entry] : table_) {
    if (!Stalled(entry, now, seconds) || (only_new && entry.warned)) continue;
    const double waited = std::chrono::duration<double>(now - entry.first_seen).count();
    entry.warned = true;
    Stall stall;
    stall.name = name;
    stall.seconds = waited;
    for (int r = 0; r < size_; ++r) {
      if (entry.seen[r]) {
        stall.submitted.push_back(r);
      } else if (!joined_[r]) {
        stall.missing.push_back(r);
        stall.waiting_instead.push_back(WaitingOn(r, name));
      }
    }
    stalls.push_back(std::move(stall));
  }
  return stalls;
}

void Coordinator::FailStalled(SteadyClock::time_point now, double seconds) {
  for (const Stall& stall : FindStalls(now, seconds, /*only_new=*/false)) {
    Response response;
    response.kind = Response::Kind::kError;
    response.name = stall.name;
    std::ostringstream message;
    message.precision(3);
    if (IsJoin(table_[stall.name])) {
      message << "join() waited " << stall.seconds << " s for rank(s) "
              << RankListText(stall.missing)
              << ", which neither joined nor submitted any collective for twice the bound (rank(s) "
              << RankListText(stall.submitted)
              << " joined), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS"
              << ExplainStall(stall)
              << ". Every rank must call join() once it has no more collectives to run.";
      response.error = message.str();
      ready_.push_back(std::move(response));
      Erase(stall.name);
      ForgetJoins();
      continue;
    }
    message << "Collective '" << stall.name << "' stalled for " << stall.seconds
            << " s: rank(s) " << RankListText(stall.missing) << " never submitted it (rank(s) "
            << RankListText(stall.submitted)
            << " did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS" << ExplainStall(stall)
            << ". Check that every rank runs the same collectives (e.g. the same number of "
               "steps).";
    response.error = message.str();
    ready_.push_back(std::move(response));
    Erase(stall.name);
  }
}

}  // namespace hvdkeras

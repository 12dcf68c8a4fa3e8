#include "core/coordinator.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <sstream>

namespace hvdkeras {

namespace {

using Describe = std::function<std::string(const Request&)>;

// Describes a per-rank value that differs across ranks, grouping ranks that
// sent the same thing: "[2, 3] from ranks 0, 2; [3, 3] from rank 1".
std::string DescribeByRank(const std::vector<Request>& requests, const Describe& describe) {
  std::vector<std::string> values;
  std::vector<std::vector<int>> ranks;
  for (const Request& r : requests) {
    std::string v = describe(r);
    size_t i = 0;
    while (i < values.size() && values[i] != v) ++i;
    if (i == values.size()) {
      values.push_back(v);
      ranks.emplace_back();
    }
    ranks[i].push_back(r.rank);
  }
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out << "; ";
    out << values[i] << " from rank" << (ranks[i].size() > 1 ? "s " : " ");
    for (size_t k = 0; k < ranks[i].size(); ++k) {
      if (k) out << ", ";
      out << ranks[i][k];
    }
  }
  return out.str();
}

bool AllSame(const std::vector<Request>& requests, const Describe& describe) {
  const std::string first = describe(requests[0]);
  for (const Request& r : requests) {
    if (describe(r) != first) return false;
  }
  return true;
}

std::string FormatDouble(double v) {
  std::ostringstream out;
  out.precision(17);  // round-trips a double: equal text means equal values
  out << v;
  return out.str();
}

template <typename T, typename F>
std::string JoinList(const std::vector<T>& items, F format) {
  if (items.size() == 1) return format(items[0]);
  std::string s = "(";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) s += ", ";
    s += format(items[i]);
  }
  return s + ")";
}

std::string DtypesString(const Request& r) {
  return JoinList(r.dtypes, [](DataType d) { return std::string(DataTypeName(d)); });
}

std::string ShapesString(const Request& r) { return JoinList(r.shapes, ShapeString); }

// Shapes with the first dimension left out, for ops where it may differ.
std::string TrailingShapesString(const Request& r) {
  return JoinList(r.shapes, [](const Shape& s) {
    if (s.empty()) return std::string("a scalar");
    std::string text = "[*";
    for (size_t d = 1; d < s.size(); ++d) text += ", " + std::to_string(s[d]);
    return text + "]";
  });
}

bool FirstDimMayDiffer(OpType op) { return op == OpType::kAllgather || op == OpType::kAlltoall; }

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::string ValidateRequests(const std::vector<Request>& submitted, int world_size,
                             const std::vector<bool>& joined) {
  const Request& first = submitted[0];
  const std::string tensor = "'" + first.name + "'";
  const std::string what = std::string(OpTypeName(first.op_type)) + " of tensor " + tensor;
  auto mismatch = [&](const std::string& field, const Describe& describe) {
    return "Mismatched " + field + " for " + what + " across ranks: " +
           DescribeByRank(submitted, describe) + ". Every rank must submit the same " + field +
           " under one name.";
  };
  auto op_name = [](const Request& r) { return std::string(OpTypeName(r.op_type)); };
  if (!AllSame(submitted, op_name)) {
    return "Mismatched operations for tensor " + tensor + " across ranks: " +
           DescribeByRank(submitted, op_name) + ". Every rank must run the same collective "
           "under one name.";
  }
  auto device = [](const Request& r) { return std::string(DeviceKindName(r.device)); };
  if (!AllSame(submitted, device)) {
    return "Mismatched devices for " + what + " across ranks: " + DescribeByRank(submitted, device) +
           ". Every rank must hold the tensor in the same kind of memory: give every process "
           "a GPU (hvdkeras.pin_gpu()) or none.";
  }
  auto count = [](const Request& r) { return std::to_string(r.shapes.size()) + " tensor(s)"; };
  if (!AllSame(submitted, count)) return mismatch("tensor counts", count);
  if (!AllSame(submitted, DtypesString)) return mismatch("data types", DtypesString);

  if (FirstDimMayDiffer(first.op_type)) {
    for (const Request& r : submitted) {
      for (const Shape& s : r.shapes) {
        if (s.empty()) {
          return "Cannot run " + what + ": rank " + std::to_string(r.rank) +
                 " sent a scalar, but " + OpTypeName(first.op_type) +
                 " needs at least one dimension.";
        }
      }
    }
    if (!AllSame(submitted, TrailingShapesString)) {
      return mismatch("shapes (all dimensions but the first must match)", TrailingShapesString);
    }
  } else if (!AllSame(submitted, ShapesString)) {
    return mismatch("shapes", ShapesString);
  }

  switch (first.op_type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter: {
      auto reduce = [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); };
      if (!AllSame(submitted, reduce)) return mismatch("reduction ops", reduce);
      auto scales = [](const Request& r) {
        return "prescale " + FormatDouble(r.prescale) + " / postscale " + FormatDouble(r.postscale);
      };
      if (!AllSame(submitted, scales)) return mismatch("scale factors", scales);
      if (first.op_type == OpType::kReducescatter) {
        for (const Request& r : submitted) {
          for (const Shape& s : r.shapes) {
            if (s.empty()) {
              return "Cannot run " + what + ": rank " + std::to_string(r.rank) +
                     " sent a scalar, but reducescatter splits the first dimension.";
            }
          }
        }
      }
      break;
    }
    case OpType::kBroadcast: {
      auto root = [](const Request& r) { return "root " + std::to_string(r.root_rank); };
      if (!AllSame(submitted, root)) return mismatch("root ranks", root);
      if (first.root_rank < 0 || first.root_rank >= world_size) {
        return "Invalid root rank " + std::to_string(first.root_rank) + " for " + what +
               ": the world has " + std::to_string(world_size) +
               " rank(s), so the root must be in 0.." + std::to_string(world_size - 1) + ".";
      }
      if (joined[first.root_rank]) {
        return "Cannot run " + what + ": its root rank " + std::to_string(first.root_rank) +
               " has already called join().";
      }
      break;
    }
    case OpType::kAlltoall:
      for (const Request& r : submitted) {
        const std::string rank = "rank " + std::to_string(r.rank);
        if (r.shapes.size() != 1) {
          return "Invalid " + what + ": " + rank + " sent " + std::to_string(r.shapes.size()) +
                 " tensors; alltoall takes exactly one.";
        }
        if (r.splits.size() != static_cast<size_t>(world_size)) {
          return "Invalid splits for " + what + ": " + rank + " gave " +
                 std::to_string(r.splits.size()) + " split(s), but the world has " +
                 std::to_string(world_size) + " rank(s); give one row count per rank.";
        }
        int64_t total = 0;
        for (int64_t v : r.splits) {
          if (v < 0) {
            return "Invalid splits for " + what + ": " + rank + " gave a negative row count " +
                   std::to_string(v) + ".";
          }
          total += v;
        }
        if (total != r.shapes[0][0]) {
          return "Invalid splits for " + what + ": " + rank + "'s splits add up to " +
                 std::to_string(total) + " rows, but its tensor has " +
                 std::to_string(r.shapes[0][0]) + " rows.";
        }
      }
      break;
    default:
      break;
  }
  return "";
}

Coordinator::Coordinator(int size)
    : size_(size), last_request_(size, SteadyClock::now()), joined_(size, false) {}

bool Coordinator::IsReady(const Entry& entry) const {
  for (int r = 0; r < size_; ++r) {
    if (!entry.seen[r] && !joined_[r]) return false;
  }
  return entry.received > 0;
}

Response Coordinator::BuildResponse(const Entry& entry) const {
  std::vector<Request> submitted;
  for (int r = 0; r < size_; ++r) {
    if (entry.seen[r]) submitted.push_back(entry.by_rank[r]);
  }
  Response response;
  response.name = submitted[0].name;
  response.agreed = submitted[0];
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
        if (entry.seen[r]) response.sizes[t * size_ + r] = entry.by_rank[r].shapes[t][0];
      }
    }
  } else if (agreed.op_type == OpType::kAlltoall) {
    response.sizes.assign(static_cast<size_t>(size_) * size_, 0);
    for (int s = 0; s < size_; ++s) {
      if (!entry.seen[s]) continue;
      for (int d = 0; d < size_; ++d) response.sizes[s * size_ + d] = entry.by_rank[s].splits[d];
    }
  } else if (agreed.op_type == OpType::kJoin) {
    response.last_joined_rank = join_order_.empty() ? -1 : join_order_.back();
  }
  return response;
}

void Coordinator::Add(const Request& request, SteadyClock::time_point now) {
  if (request.rank < 0 || request.rank >= size_) return;  // not from this world
  Entry& entry = table_[request.name];
  if (entry.by_rank.empty()) {
    entry.by_rank.resize(size_);
    entry.seen.assign(size_, false);
    entry.submitted_at.resize(size_);
    entry.sequence = next_sequence_++;
    entry.first_seen = now;
  }
  const auto submitted_at =
      now - std::chrono::duration_cast<SteadyClock::duration>(
                std::chrono::duration<double>(request.age_seconds));
  entry.first_seen = std::min(entry.first_seen, submitted_at);
  entry.submitted_at[request.rank] = submitted_at;
  last_request_[request.rank] = std::max(last_request_[request.rank], now);
  if (!entry.seen[request.rank]) ++entry.received;
  entry.seen[request.rank] = true;
  entry.by_rank[request.rank] = request;
  if (request.op_type == OpType::kJoin) {
    Join(request.rank);  // may complete other names as well
  } else if (IsReady(entry)) {
    Complete(request.name);
  }
}

void Coordinator::Complete(const std::string& name) {
  const Entry& entry = table_[name];
  ready_.push_back(BuildResponse(entry));
  pending_times_[name] = entry.submitted_at;
  table_.erase(name);
}

void Coordinator::Join(int rank) {
  if (!joined_[rank]) {
    joined_[rank] = true;
    ++joined_count_;
    join_order_.push_back(rank);
  }
  PromoteReady();
}

bool Coordinator::IsJoin(const Entry& entry) const {
  // Waiting in join() for slower ranks is the point of join, not a stall.
  for (int r = 0; r < size_; ++r) {
    if (entry.seen[r]) return entry.by_rank[r].op_type == OpType::kJoin;
  }
  return false;
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
    joined_.assign(size_, false);
    joined_count_ = 0;
    join_order_.clear();
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
    out << ". Rank(s) " << RankList(idle)
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
      message << "join() waited " << stall.seconds << " s for rank(s) " << RankList(stall.missing)
              << ", which neither joined nor submitted any collective for twice the bound (rank(s) "
              << RankList(stall.submitted)
              << " joined), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS"
              << ExplainStall(stall)
              << ". Every rank must call join() once it has no more collectives to run.";
      response.error = message.str();
      ready_.push_back(std::move(response));
      table_.erase(stall.name);
      joined_.assign(size_, false);  // the ranks that joined are ranks again
      joined_count_ = 0;
      join_order_.clear();
      continue;
    }
    message << "Collective '" << stall.name << "' stalled for " << stall.seconds
            << " s: rank(s) " << RankList(stall.missing) << " never submitted it (rank(s) "
            << RankList(stall.submitted)
            << " did), so it was ended by HVDKERAS_STALL_SHUTDOWN_SECONDS" << ExplainStall(stall)
            << ". Check that every rank runs the same collectives (e.g. the same number of "
               "steps).";
    response.error = message.str();
    ready_.push_back(std::move(response));
    table_.erase(stall.name);
  }
}

}  // namespace hvdkeras

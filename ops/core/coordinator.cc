#include "core/coordinator.h"

#include <functional>
#include <sstream>

namespace hvdkeras {

namespace {

// Describes a per-rank value that differs across ranks, grouping ranks that
// sent the same thing: "[2, 3] from ranks 0, 2; [3, 3] from rank 1".
std::string DescribeByRank(const std::vector<Request>& by_rank,
                           const std::function<std::string(const Request&)>& describe) {
  std::vector<std::string> values;
  std::vector<std::vector<int>> ranks;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    std::string v = describe(by_rank[r]);
    size_t i = 0;
    while (i < values.size() && values[i] != v) ++i;
    if (i == values.size()) {
      values.push_back(v);
      ranks.emplace_back();
    }
    ranks[i].push_back(static_cast<int>(r));
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

bool AllSame(const std::vector<Request>& by_rank,
             const std::function<std::string(const Request&)>& describe) {
  std::string first = describe(by_rank[0]);
  for (size_t r = 1; r < by_rank.size(); ++r) {
    if (describe(by_rank[r]) != first) return false;
  }
  return true;
}

std::string FormatDouble(double v) {
  std::ostringstream out;
  out.precision(9);
  out << v;
  return out.str();
}

std::string DtypesString(const Request& r) {
  if (r.dtypes.size() == 1) return DataTypeName(r.dtypes[0]);
  std::string s = "(";
  for (size_t i = 0; i < r.dtypes.size(); ++i) {
    if (i) s += ", ";
    s += DataTypeName(r.dtypes[i]);
  }
  return s + ")";
}

std::string ShapesString(const Request& r) {
  if (r.shapes.size() == 1) return ShapeString(r.shapes[0]);
  std::string s = "(";
  for (size_t i = 0; i < r.shapes.size(); ++i) {
    if (i) s += ", ";
    s += ShapeString(r.shapes[i]);
  }
  return s + ")";
}

}  // namespace

std::string ValidateRequests(const std::vector<Request>& by_rank, int world_size) {
  const Request& first = by_rank[0];
  const std::string tensor = "'" + first.name + "'";
  struct Check {
    const char* what;
    std::function<std::string(const Request&)> describe;
  };
  const std::vector<Check> checks = {
      {"operations", [](const Request& r) { return std::string(OpTypeName(r.op_type)); }},
      {"tensor counts in the group",
       [](const Request& r) { return std::to_string(r.shapes.size()) + " tensor(s)"; }},
      {"data types", DtypesString},
      {"shapes", ShapesString},
  };
  for (const Check& check : checks) {
    if (!AllSame(by_rank, check.describe)) {
      return std::string("Mismatched ") + check.what + " for " + OpTypeName(first.op_type) +
             " of tensor " + tensor + " across ranks: " + DescribeByRank(by_rank, check.describe) +
             ". Every rank must submit the same op with the same " + check.what +
             " under one name.";
    }
  }
  if (first.op_type == OpType::kAllreduce) {
    auto reduce = [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); };
    if (!AllSame(by_rank, reduce)) {
      return "Mismatched reduction ops for allreduce of tensor " + tensor +
             " across ranks: " + DescribeByRank(by_rank, reduce) + ".";
    }
    auto scales = [](const Request& r) {
      return "prescale " + FormatDouble(r.prescale) + " / postscale " + FormatDouble(r.postscale);
    };
    if (!AllSame(by_rank, scales)) {
      return "Mismatched scale factors for allreduce of tensor " + tensor +
             " across ranks: " + DescribeByRank(by_rank, scales) + ".";
    }
  }
  if (first.op_type == OpType::kBroadcast) {
    auto root = [](const Request& r) { return "root " + std::to_string(r.root_rank); };
    if (!AllSame(by_rank, root)) {
      return "Mismatched root ranks for broadcast of tensor " + tensor + " across ranks: " +
             DescribeByRank(by_rank, root) + ".";
    }
    if (first.root_rank < 0 || first.root_rank >= world_size) {
      return "Invalid root rank " + std::to_string(first.root_rank) +
             " for broadcast of tensor " + tensor + ": the world has " +
             std::to_string(world_size) + " rank(s), so the root must be in 0.." +
             std::to_string(world_size - 1) + ".";
    }
  }
  return "";
}

void Coordinator::Add(const Request& request) {
  Entry& entry = table_[request.name];
  if (entry.by_rank.empty()) {
    entry.by_rank.resize(size_);
    entry.seen.assign(size_, false);
  }
  if (!entry.seen[request.rank]) ++entry.received;
  entry.seen[request.rank] = true;
  entry.by_rank[request.rank] = request;
  if (entry.received < size_) return;

  Response response;
  response.name = request.name;
  std::string error = ValidateRequests(entry.by_rank, size_);
  if (!error.empty()) {
    response.kind = Response::Kind::kError;
    response.error = std::move(error);
  }
  ready_.push_back(std::move(response));
  table_.erase(request.name);
}

std::vector<Response> Coordinator::TakeReady() {
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

}  // namespace hvdkeras

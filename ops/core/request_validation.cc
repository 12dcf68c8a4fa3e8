#include "core/request_validation.h"

#include <functional>
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
    out << values[i] << " from rank" << (ranks[i].size() > 1 ? "s " : " ")
        << RankListText(ranks[i]);
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
  auto priority = [](const Request& r) { return "priority " + std::to_string(r.priority); };
  if (!AllSame(submitted, priority)) return mismatch("priorities", priority);
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

}  // namespace hvdkeras

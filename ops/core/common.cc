#include "core/common.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace hvdkeras {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, ...) \
  case DataType::enumerator:                                \
    return bytes;
#include "core/types.def"
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
#define HVDKERAS_DTYPE(enumerator, value, name, ...) \
  case DataType::enumerator:                         \
    return name;
#include "core/types.def"
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
#define HVDKERAS_REDUCE_OP(enumerator, value, name) \
  case ReduceOp::enumerator:                        \
    return name;
#include "core/types.def"
  }
  return "unknown";
}

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAllgather: return "allgather";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
  }
  return "unknown";
}

const char* DeviceKindName(DeviceKind device) {
  switch (device) {
    case DeviceKind::kCpu: return "CPU";
    case DeviceKind::kGpu: return "GPU";
  }
  return "unknown";
}

bool IsValidDataType(int32_t value) {
  switch (value) {
#define HVDKERAS_DTYPE(enumerator, value, ...) case value:
#include "core/types.def"
      return true;
  }
  return false;
}

bool IsValidReduceOp(int32_t value) {
  switch (value) {
#define HVDKERAS_REDUCE_OP(enumerator, value, name) case value:
#include "core/types.def"
      return true;
  }
  return false;
}

bool IsFloatingPoint(DataType dtype) {
  switch (dtype) {
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, reducible, floating, ...) \
  case DataType::enumerator:                                                     \
    return floating;
#include "core/types.def"
  }
  return false;
}

bool IsReducible(DataType dtype) {
  switch (dtype) {
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, reducible, ...) \
  case DataType::enumerator:                                           \
    return reducible;
#include "core/types.def"
  }
  return false;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool FirstDimMayDiffer(OpType op) { return op == OpType::kAllgather || op == OpType::kAlltoall; }

std::string ShapeString(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out << ", ";
    out << shape[i];
  }
  out << "]";
  return out.str();
}

std::string RankListText(const std::vector<int>& ranks, size_t most_runs) {
  std::string text;
  size_t runs = 0;
  size_t i = 0;
  while (i < ranks.size()) {
    size_t end = i + 1;  // one past the run that starts at i
    while (end < ranks.size() && ranks[end] == ranks[end - 1] + 1) ++end;
    if (most_runs && runs == most_runs) {
      text += " and " + std::to_string(ranks.size() - i) + " more";
      break;
    }
    if (end - i < 3) end = i + 1;  // two in a row read better as "4, 5"
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (end - i >= 3) text += "-" + std::to_string(ranks[end - 1]);
    ++runs;
    i = end;
  }
  return text;
}

void CopyText(const std::string& text, char* out, int capacity) {
  if (!out || capacity <= 0) return;
  const size_t n = std::min(text.size(), static_cast<size_t>(capacity - 1));
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace hvdkeras

// Basic vocabulary of the hvdkeras engine: data types, reductions, statuses
// and shapes. Framework-free: nothing here knows about TensorFlow or MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdkeras {

// Element types the engine moves and reductions it applies: see
// Note [wire vocabulary] in types.def, which lists them.
enum class DataType : int32_t {
#define HVDKERAS_DTYPE(enumerator, value, ...) enumerator = value,
#include "core/types.def"
};

enum class ReduceOp : int32_t {
#define HVDKERAS_REDUCE_OP(enumerator, value, name) enumerator = value,
#include "core/types.def"
};

// Where a request's tensors live. Every rank must agree: the engine runs a
// CPU batch over MPI or shared memory and a GPU batch through the device
// backend (device.h).
enum class DeviceKind : int32_t {
  kCpu = 0,
  kGpu = 1,
};

// Collective operations the engine negotiates.
enum class OpType : int32_t {
  kAllreduce = 0,
  kBroadcast = 1,
  kAllgather = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};

enum class StatusCode : int32_t {
  kOk = 0,
  kPreconditionError = 1,  // ranks disagree, or the engine is not running
  kInvalidArgument = 2,    // a request that can never succeed
  kAborted = 3,            // the engine shut down under the op
  kUnknown = 4,
};

struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static Status OK() { return Status(); }
  static Status Error(StatusCode code, std::string message) {
    Status s;
    s.code = code;
    s.message = std::move(message);
    return s;
  }
};

using Shape = std::vector<int64_t>;

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);
const char* DeviceKindName(DeviceKind device);
bool IsValidDataType(int32_t value);
bool IsValidReduceOp(int32_t value);
bool IsFloatingPoint(DataType dtype);
// Whether allreduce and reducescatter accept the type (the others move any).
bool IsReducible(DataType dtype);

// Allgather and alltoall: each rank may send its own first dimension.
bool FirstDimMayDiffer(OpType op);
int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);
// Ranks in words for messages: "0, 2, 5-9" for {0, 2, 5, 6, 7, 8, 9} (runs of
// three or more as a range, so a message about thousands of ranks stays a
// line). After `most_runs` items the rest is counted: "... and 12 more".
// Expects ascending ranks; 0 for `most_runs` means no cap.
std::string RankListText(const std::vector<int>& ranks, size_t most_runs = 32);
// Writes `text` into the C buffer `out` of `capacity` bytes, cut to fit and
// NUL-terminated (for the C entry points' messages).
void CopyText(const std::string& text, char* out, int capacity);

}  // namespace hvdkeras

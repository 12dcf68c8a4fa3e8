// Basic vocabulary of the hvdkeras engine: data types, reductions, statuses
// and shapes. Framework-free: nothing here knows about TensorFlow or MPI.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hvdkeras {

// Element types the engine moves. Values are part of the wire format.
enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBFloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kBool = 8,
  // Broadcast-only types: moved as bytes, never reduced.
  kUInt16 = 9,
  kInt16 = 10,
  kUInt32 = 11,
  kUInt64 = 12,
};

// Reductions, numbered as Horovod numbers them so scripts that pass raw
// integers keep their meaning (2 was Adasum, which hvdkeras does not offer).
enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
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
bool IsValidDataType(int32_t value);
bool IsValidReduceOp(int32_t value);
bool IsFloatingPoint(DataType dtype);

int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);

}  // namespace hvdkeras

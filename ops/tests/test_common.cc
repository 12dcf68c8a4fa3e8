// Unit tests of the shared vocabulary (core/common.cc, generated from
// core/types.def; see Note [wire vocabulary]): sizes, names, which types
// reduce, and the values that are not types or reductions.
#include <cstdint>
#include <string>

#include "core/common.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::ReduceOp;

TEST(DataTypesHaveTheirWireValuesSizesAndNames) {
  CHECK_EQ(static_cast<int>(DataType::kUInt8), 0);
  CHECK_EQ(static_cast<int>(DataType::kFloat32), 6);
  CHECK_EQ(static_cast<int>(DataType::kUInt64), 12);
  CHECK_EQ(hvdkeras::DataTypeSize(DataType::kBFloat16), size_t{2});
  CHECK_EQ(hvdkeras::DataTypeSize(DataType::kFloat64), size_t{8});
  CHECK_EQ(hvdkeras::DataTypeSize(DataType::kBool), size_t{1});
  CHECK_EQ(std::string(hvdkeras::DataTypeName(DataType::kFloat16)), std::string("float16"));
  CHECK_EQ(std::string(hvdkeras::DataTypeName(DataType::kUInt32)), std::string("uint32"));
}

TEST(OnlyNumericTypesUpToFloat64Reduce) {
  int reducible = 0;
  for (int v = 0; v <= 12; ++v) {
    CHECK(hvdkeras::IsValidDataType(v));
    if (hvdkeras::IsReducible(static_cast<DataType>(v))) ++reducible;
  }
  CHECK_EQ(reducible, 8);
  CHECK(hvdkeras::IsReducible(DataType::kBFloat16));
  CHECK(!hvdkeras::IsReducible(DataType::kBool));
  CHECK(!hvdkeras::IsReducible(DataType::kUInt16));
  CHECK(hvdkeras::IsFloatingPoint(DataType::kFloat16));
  CHECK(!hvdkeras::IsFloatingPoint(DataType::kInt64));
  CHECK(!hvdkeras::IsValidDataType(-1));
  CHECK(!hvdkeras::IsValidDataType(13));
}

TEST(ReduceOpsKeepHorovodsNumbers) {
  CHECK_EQ(static_cast<int>(ReduceOp::kAverage), 0);
  CHECK_EQ(static_cast<int>(ReduceOp::kSum), 1);
  CHECK_EQ(static_cast<int>(ReduceOp::kProduct), 5);
  CHECK(!hvdkeras::IsValidReduceOp(2));  // Horovod's Adasum
  CHECK(!hvdkeras::IsValidReduceOp(6));
  CHECK_EQ(std::string(hvdkeras::ReduceOpName(ReduceOp::kMin)), std::string("Min"));
}

}  // namespace

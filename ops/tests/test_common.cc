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

TEST(RankListTextFoldsRunsAndCapsTheRest) {
  using hvdkeras::RankListText;
  CHECK_EQ(RankListText({}), std::string(""));
  CHECK_EQ(RankListText({3}), std::string("3"));
  CHECK_EQ(RankListText({0, 2}), std::string("0, 2"));
  CHECK_EQ(RankListText({4, 5}), std::string("4, 5"));  // two in a row stay two
  CHECK_EQ(RankListText({0, 2, 5, 6, 7, 8, 9}), std::string("0, 2, 5-9"));
  CHECK_EQ(RankListText({1, 2, 3, 7, 8}), std::string("1-3, 7, 8"));
  std::vector<int> all(16384);
  for (int r = 0; r < 16384; ++r) all[r] = r;
  CHECK_EQ(RankListText(all), std::string("0-16383"));
  std::vector<int> evens;
  for (int r = 0; r < 100; r += 2) evens.push_back(r);
  CHECK_EQ(RankListText(evens, 3), std::string("0, 2, 4 and 47 more"));
  const std::string uncapped = RankListText(evens, 0);
  CHECK(uncapped.find("more") == std::string::npos);
  CHECK_EQ(uncapped.substr(uncapped.size() - 8), std::string("94, 96, 98").substr(2));
}

}  // namespace

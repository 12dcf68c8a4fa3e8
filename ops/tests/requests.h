// Requests as the unit tests build them (see harness.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/message.h"

namespace test_harness {

inline hvdkeras::Request MakeRequest(const std::string& name, hvdkeras::Shape shape = {4},
                                     hvdkeras::DataType dtype = hvdkeras::DataType::kFloat32,
                                     int32_t rank = 0) {
  hvdkeras::Request r;
  r.name = name;
  r.rank = rank;
  r.dtypes = {dtype};
  r.shapes = {std::move(shape)};
  return r;
}

// Requests of each kind with the shapes the tests use unless told otherwise.
inline hvdkeras::Request Allreduce(const std::string& name, int rank,
                                   hvdkeras::Shape shape = {2, 3},
                                   hvdkeras::DataType dtype = hvdkeras::DataType::kFloat32) {
  return MakeRequest(name, std::move(shape), dtype, rank);
}

inline hvdkeras::Request Broadcast(const std::string& name, int rank, int root) {
  hvdkeras::Request r = MakeRequest(name, {5}, hvdkeras::DataType::kInt32, rank);
  r.op_type = hvdkeras::OpType::kBroadcast;
  r.root_rank = root;
  return r;
}

inline hvdkeras::Request OfType(hvdkeras::OpType op, const std::string& name, int rank,
                                hvdkeras::Shape shape = {4, 3}) {
  hvdkeras::Request r =
      MakeRequest(name, std::move(shape), hvdkeras::DataType::kFloat32, rank);
  r.op_type = op;
  return r;
}

inline hvdkeras::Request Alltoall(const std::string& name, int rank, int64_t rows,
                                  std::vector<int64_t> splits) {
  hvdkeras::Request r = OfType(hvdkeras::OpType::kAlltoall, name, rank, {rows, 2});
  r.splits = std::move(splits);
  return r;
}

inline hvdkeras::Request Join(int rank) {
  hvdkeras::Request r;
  r.name = "join";
  r.rank = rank;
  r.op_type = hvdkeras::OpType::kJoin;
  return r;
}

}  // namespace test_harness

// Unit tests of requests and responses (core/message.cc): signatures, sizes
// and the binary encoding's round trips.
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/message.h"
#include "tests/harness.h"
#include "tests/requests.h"

namespace {

using hvdkeras::DataType;
using hvdkeras::OpType;
using hvdkeras::ReduceOp;
using hvdkeras::Request;
using hvdkeras::Response;
using test_harness::Fail;
using test_harness::g_checks;
using test_harness::Allreduce;
using test_harness::Broadcast;
using test_harness::MakeRequest;

// ==========================================================================
// Request / response encoding
// ==========================================================================

bool SameRequest(const Request& a, const Request& b) {
  return a.SameSignature(b) && a.rank == b.rank && a.splits == b.splits &&
         a.age_seconds == b.age_seconds;
}

TEST(RequestSameSignature) {
  Request a = MakeRequest("x", {2, 3}), b = MakeRequest("x", {2, 3}, DataType::kFloat32, 5);
  b.age_seconds = 9.0;
  CHECK(a.SameSignature(b));  // rank and age are not part of the signature
  std::vector<std::function<void(Request*)>> changes = {
      [](Request* r) { r->name = "y"; },
      [](Request* r) { r->op_type = OpType::kBroadcast; },
      [](Request* r) { r->reduce_op = ReduceOp::kMax; },
      [](Request* r) { r->prescale = 2.0; },
      [](Request* r) { r->postscale = 2.0; },
      [](Request* r) { r->root_rank = 1; },
      [](Request* r) { r->dtypes = {DataType::kFloat64}; },
      [](Request* r) { r->shapes = {{3, 2}}; },
      [](Request* r) { r->splits = {1, 1}; },
      [](Request* r) { r->device = hvdkeras::DeviceKind::kGpu; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    Request c = a;
    changes[i](&c);
    if (c.SameSignature(a) || a.SameSignature(c)) {
      Fail(__FILE__, __LINE__, "change #" + std::to_string(i) + " not seen by SameSignature");
    }
    ++g_checks;
  }
}

TEST(RequestEncodeDecodeRoundTrip) {
  std::vector<Request> requests;
  requests.push_back(Allreduce("plain", 3, {2, 3}));
  {
    Request g = Allreduce("group/with.dots-and_underscores", 1);
    g.op_type = OpType::kAllreduce;
    g.reduce_op = ReduceOp::kProduct;
    g.prescale = 0.1;
    g.postscale = -1.0 / 3.0;
    g.dtypes = {DataType::kFloat16, DataType::kFloat16, DataType::kFloat16};
    g.shapes = {{}, {0}, {1, 2, 3, 4, 5, 6, 7, int64_t{1} << 40}};
    requests.push_back(g);
  }
  {
    Request b = Broadcast(std::string("bin\0ary", 7), 0, 5);
    b.dtypes = {DataType::kBool, DataType::kUInt64};
    b.shapes = {{3}, {1}};
    requests.push_back(b);
  }
  {
    Request empty;  // no tensors at all, empty name
    empty.rank = 7;
    empty.op_type = OpType::kJoin;
    requests.push_back(empty);
  }
  {
    Request a = MakeRequest("a2a", {6, 2}, DataType::kInt64, 2);
    a.op_type = OpType::kAlltoall;
    a.splits = {1, 0, 5, -3};
    a.age_seconds = 12.625;
    a.device = hvdkeras::DeviceKind::kGpu;
    requests.push_back(a);
  }
  const std::string bytes = hvdkeras::EncodeRequests(requests);
  std::vector<Request> decoded;
  CHECK(hvdkeras::DecodeRequests(bytes.data(), bytes.size(), &decoded));
  CHECK_EQ(decoded.size(), requests.size());
  for (size_t i = 0; i < decoded.size() && i < requests.size(); ++i) {
    CHECK(SameRequest(decoded[i], requests[i]));
    CHECK_EQ(decoded[i].name, requests[i].name);
  }
  if (decoded.size() > 1) CHECK_EQ(decoded[1].postscale, -1.0 / 3.0);  // bit-exact double
  if (decoded.size() > 4) CHECK(decoded[4].device == hvdkeras::DeviceKind::kGpu);

  // Empty list.
  const std::string none = hvdkeras::EncodeRequests({});
  decoded.clear();
  CHECK(hvdkeras::DecodeRequests(none.data(), none.size(), &decoded));
  CHECK(decoded.empty());

  // Every truncation fails, and so do trailing bytes.
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<Request> partial;
    if (hvdkeras::DecodeRequests(bytes.data(), n, &partial)) {
      Fail(__FILE__, __LINE__, "DecodeRequests accepted a truncation to " + std::to_string(n) +
                                   " of " + std::to_string(bytes.size()) + " bytes");
    }
  }
  const std::string longer = bytes + "x";
  decoded.clear();
  CHECK(!hvdkeras::DecodeRequests(longer.data(), longer.size(), &decoded));
  CHECK(!hvdkeras::DecodeRequests(nullptr, 0, &decoded));

  // A corrupt length field that promises more items than bytes remain is
  // rejected before anything is allocated for it.
  Request one = Allreduce("len", 0, {2});
  std::string corrupt = hvdkeras::EncodeRequests({one});
  // Layout: count(4) name_len(4) "len"(3) rank(4) op(4) reduce(4) pre(8)
  // post(8) root(4) device(4) ntensors(4) dtype(4) ndims(4) ...
  const size_t ndims_offset = 4 + 4 + 3 + 4 + 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4;
  const uint32_t huge = 0xffffffffu;
  std::memcpy(&corrupt[ndims_offset], &huge, sizeof(huge));
  decoded.clear();
  CHECK(!hvdkeras::DecodeRequests(corrupt.data(), corrupt.size(), &decoded));
}

TEST(ResponseEncodeDecodeRoundTrip) {
  std::vector<Response> responses(4);
  responses[0].name = "ok";
  responses[0].agreed = MakeRequest("ok", {3, 1}, DataType::kBFloat16, 2);
  responses[0].agreed.op_type = OpType::kAllgather;
  responses[0].sizes = {3, 0, 7};
  responses[1].name = "bad";
  responses[1].kind = Response::Kind::kError;
  responses[1].error =
      "Mismatched shapes for allreduce of tensor 'bad' across ranks: [1] from rank 0; [2] from "
      "rank 1. Every rank must submit the same op with the same shapes under one name.";
  responses[2].name = std::string(300, 'n');
  responses[2].kind = Response::Kind::kError;
  responses[2].error = std::string("with\0nul", 8);
  responses[3].name = "join";
  responses[3].agreed.op_type = OpType::kJoin;
  responses[3].last_joined_rank = 3;
  const std::string bytes = hvdkeras::EncodeResponses(responses);
  std::vector<Response> decoded;
  CHECK(hvdkeras::DecodeResponses(bytes.data(), bytes.size(), &decoded));
  CHECK_EQ(decoded.size(), responses.size());
  for (size_t i = 0; i < decoded.size() && i < responses.size(); ++i) {
    CHECK_EQ(decoded[i].kind, responses[i].kind);
    CHECK_EQ(decoded[i].name, responses[i].name);
    CHECK_EQ(decoded[i].error, responses[i].error);
    CHECK(SameRequest(decoded[i].agreed, responses[i].agreed));
    CHECK_EQ(decoded[i].sizes, responses[i].sizes);
    CHECK_EQ(decoded[i].last_joined_rank, responses[i].last_joined_rank);
  }
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<Response> partial;
    if (hvdkeras::DecodeResponses(bytes.data(), n, &partial)) {
      Fail(__FILE__, __LINE__, "DecodeResponses accepted a truncation to " + std::to_string(n) +
                                   " of " + std::to_string(bytes.size()) + " bytes");
    }
  }
  const std::string longer = bytes + "x";
  decoded.clear();
  CHECK(!hvdkeras::DecodeResponses(longer.data(), longer.size(), &decoded));
  const std::string none = hvdkeras::EncodeResponses({});
  decoded.clear();
  CHECK(hvdkeras::DecodeResponses(none.data(), none.size(), &decoded));
  CHECK(decoded.empty());
}

TEST(RequestTotalBytes) {
  Request r = Allreduce("x", 0, {2, 3}, DataType::kFloat64);
  CHECK_EQ(r.TotalBytes(), int64_t{48});
  r.dtypes = {DataType::kFloat16, DataType::kInt64, DataType::kUInt8};
  r.shapes = {{5}, {}, {0, 9}};
  CHECK_EQ(r.TotalBytes(), int64_t{10 + 8 + 0});
}

}  // namespace

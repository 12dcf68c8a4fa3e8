// Unit tests of the requests' digests (core/request_digest.cc, Note
// [requests by signature hash]): which differences change the hash, the
// round trip of digests, and rebuilding a rank's request from one
// signature and its own numbers.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/request_digest.h"
#include "tests/harness.h"
#include "tests/requests.h"

namespace {

using hvdkeras::OpType;
using hvdkeras::Request;
using hvdkeras::SignatureHash;
using test_harness::Allreduce;
using test_harness::Alltoall;
using test_harness::OfType;

TEST(OnlyWhatMustAgreeChangesTheHash) {
  const Request a = Allreduce("g", 0);
  Request b = Allreduce("g", 5);  // another rank
  b.age_seconds = 3.0;
  CHECK_EQ(SignatureHash(a), SignatureHash(b));
  CHECK(SignatureHash(a) != SignatureHash(Allreduce("h", 0)));
  CHECK(SignatureHash(a) != SignatureHash(Allreduce("g", 0, {3, 2})));
  CHECK(SignatureHash(a) != SignatureHash(Allreduce("g", 0, {2, 3}, hvdkeras::DataType::kFloat64)));
  Request scaled = a;
  scaled.prescale = -0.0;
  Request zero = a;
  zero.prescale = 0.0;
  CHECK(SignatureHash(scaled) != SignatureHash(zero));  // as validation's text tells them apart
  // An allgather's rows and an alltoall's splits are the rank's own.
  CHECK_EQ(SignatureHash(OfType(OpType::kAllgather, "x", 0, {4, 3})),
           SignatureHash(OfType(OpType::kAllgather, "x", 1, {9, 3})));
  CHECK(SignatureHash(OfType(OpType::kAllgather, "x", 0, {4, 3})) !=
        SignatureHash(OfType(OpType::kAllgather, "x", 0, {4, 2})));
  CHECK_EQ(SignatureHash(Alltoall("t", 0, 3, {1, 2})), SignatureHash(Alltoall("t", 1, 5, {5, 0})));
  CHECK(SignatureHash(Alltoall("t", 0, 3, {1, 2})) != SignatureHash(Alltoall("t", 0, 3, {1, 2, 0})));
}

TEST(DigestsRoundTripAndRebuildEachRanksRequest) {
  std::vector<Request> sent = {Allreduce("a", 2), OfType(OpType::kAllgather, "b", 2, {7, 3}),
                               Alltoall("c", 2, 6, {1, 2, 3})};
  sent[0].age_seconds = 0.25;
  const std::string bytes = hvdkeras::EncodeRequestDigests(sent);
  CHECK(bytes.size() < 3 * 40);  // a few bytes each, whatever the name's length
  hvdkeras::DigestReader reader(bytes.data(), bytes.size());
  uint64_t hash;
  double age;
  std::vector<int64_t> numbers;
  size_t i = 0;
  for (; reader.Next(&hash, &age, &numbers); ++i) {
    CHECK_EQ(hash, SignatureHash(sent[i]));
    // The signature another rank sent, with this rank's numbers, is this rank's request.
    Request other = sent[i];
    other.rank = 0;
    if (!other.shapes.empty() && !other.shapes[0].empty() && i > 0) other.shapes[0][0] = 99;
    for (int64_t& v : other.splits) v = 0;
    const Request rebuilt =
        hvdkeras::WithPerRankNumbers(other, 2, age, numbers.data(), numbers.size());
    CHECK(rebuilt.SameSignature(sent[i]));
    CHECK_EQ(rebuilt.rank, 2);
    CHECK_EQ(rebuilt.age_seconds, sent[i].age_seconds);
  }
  CHECK_EQ(i, size_t{3});
  CHECK(reader.ok());
  hvdkeras::DigestReader cut(bytes.data(), bytes.size() - 3);
  while (cut.Next(&hash, &age, &numbers)) {
  }
  CHECK(!cut.ok());
}

TEST(WantedListsRoundTrip) {
  const std::vector<std::pair<uint64_t, int32_t>> wanted = {{7, 1}, {~uint64_t{0}, 16383}};
  const std::string bytes = hvdkeras::EncodeWanted(wanted);
  std::vector<std::pair<uint64_t, int32_t>> back;
  CHECK(hvdkeras::DecodeWanted(bytes.data(), bytes.size(), &back));
  CHECK(back == wanted);
  CHECK(!hvdkeras::DecodeWanted(bytes.data(), bytes.size() - 1, &back));
}

TEST(AgreementIgnoresOwnNumbersAndTreatsNaNAsValidationDoes) {
  CHECK(hvdkeras::AgreesWith(OfType(OpType::kAllgather, "x", 0, {4, 3}),
                             OfType(OpType::kAllgather, "x", 1, {9, 3})));
  CHECK(!hvdkeras::AgreesWith(Allreduce("g", 0), Allreduce("g", 0, {3, 2})));
  Request a = Allreduce("g", 0), b = Allreduce("g", 1);
  a.postscale = std::nan("1");
  b.postscale = std::nan("2");
  CHECK(hvdkeras::AgreesWith(a, b));
  b.postscale = 2.0;
  CHECK(!hvdkeras::AgreesWith(a, b));
}

}  // namespace

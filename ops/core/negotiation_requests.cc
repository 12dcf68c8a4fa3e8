// The slow path's requests on their way to rank 0's coordinator (Note
// [requests by signature hash] in request_digest.h).
#include <unordered_map>
#include <unordered_set>

#include "core/negotiation.h"

namespace hvdkeras {

void Negotiator::SendRequests(const std::vector<Request>& mine, Clock::time_point now) {
  // Note [requests by signature hash]: digests first; the requests rank 0
  // lacks follow in full from one rank each.
  const int size = transport_->size();
  const bool root = coordinator_ != nullptr;
  std::vector<char> gathered;
  std::vector<size_t> offsets;
  transport_->GatherAtRoot(root ? std::string() : EncodeRequestDigests(mine), &gathered,
                           &offsets);
  std::string wanted_bytes;
  std::vector<Request> fetched;  // rank 0: a full request for every hash digested
  std::vector<uint64_t> my_hashes;  // rank 0, or a rank asked for requests in full
  auto hash_mine = [&] {
    for (const Request& q : mine) my_hashes.push_back(SignatureHash(q));
  };
  if (root) {
    counts_.requests_bytes += static_cast<int64_t>(offsets.back());
    hash_mine();
    std::unordered_set<uint64_t> have(my_hashes.begin(), my_hashes.end());
    std::vector<std::pair<uint64_t, int32_t>> wanted;
    uint64_t hash;
    double age;
    std::vector<int64_t> numbers;
    for (int r = 1; r < size; ++r) {
      DigestReader digests(gathered.data() + offsets[r], offsets[r + 1] - offsets[r]);
      while (digests.Next(&hash, &age, &numbers)) {
        if (!have.insert(hash).second) continue;
        if (coordinator_->Known(hash)) {
          // Copied: adding this cycle's requests may complete its entry.
          fetched.push_back(coordinator_->Signature(hash));
        } else {
          wanted.emplace_back(hash, r);
        }
      }
    }
    wanted_bytes = EncodeWanted(wanted);
  }
  transport_->BroadcastFromRoot(&wanted_bytes);
  if (!wanted_bytes.empty()) {
    std::vector<std::pair<uint64_t, int32_t>> wanted;
    DecodeWanted(wanted_bytes.data(), wanted_bytes.size(), &wanted);
    std::unordered_set<uint64_t> asked;
    for (const auto& [hash, r] : wanted) {
      if (r == transport_->rank()) asked.insert(hash);
    }
    std::vector<Request> full;
    if (!asked.empty()) {
      hash_mine();
      for (size_t i = 0; i < mine.size(); ++i) {
        if (asked.count(my_hashes[i])) full.push_back(mine[i]);
      }
    }
    std::vector<char> full_gathered;
    std::vector<size_t> full_offsets;
    transport_->GatherAtRoot(EncodeRequests(full), &full_gathered, &full_offsets);
    if (root) {
      counts_.requests_bytes += static_cast<int64_t>(full_offsets.back());
      for (int r = 1; r < size; ++r) {
        DecodeRequests(full_gathered.data() + full_offsets[r],
                       full_offsets[r + 1] - full_offsets[r], &fetched);
      }
    }
  }

  if (root) AddGathered(mine, my_hashes, gathered, offsets, fetched, now);
}

void Negotiator::AddGathered(const std::vector<Request>& mine,
                             const std::vector<uint64_t>& my_hashes,
                             const std::vector<char>& gathered, const std::vector<size_t>& offsets,
                             const std::vector<Request>& fetched, Clock::time_point now) {
  // In rank order, each rank's requests in its own order, as they would
  // arrive whole: the order names become ready in does not depend on how
  // the requests travelled.
  std::unordered_map<uint64_t, const Request*> full;
  for (size_t i = 0; i < mine.size(); ++i) full.emplace(my_hashes[i], &mine[i]);
  for (const Request& q : fetched) full.emplace(SignatureHash(q), &q);
  uint64_t hash;
  double age;
  std::vector<int64_t> numbers;
  for (size_t i = 0; i < mine.size(); ++i) {
    numbers.clear();
    AppendPerRankNumbers(mine[i], &numbers);
    coordinator_->AddDigest(mine[i], my_hashes[i], mine[i].rank, mine[i].age_seconds,
                            numbers.data(), numbers.size(), now);
  }
  for (size_t r = 1; r + 1 < offsets.size(); ++r) {
    DigestReader digests(gathered.data() + offsets[r], offsets[r + 1] - offsets[r]);
    const int rank = static_cast<int>(r);
    while (digests.Next(&hash, &age, &numbers)) {
      // Every digested hash has a full request: the coordinator's, rank 0's
      // own, or one copied or fetched above.
      const Request* signature = nullptr;
      if (coordinator_->Known(hash)) {
        signature = &coordinator_->Signature(hash);
      } else if (auto it = full.find(hash); it != full.end()) {
        signature = it->second;
      }
      if (signature) {
        coordinator_->AddDigest(*signature, hash, rank, age, numbers.data(), numbers.size(), now);
      }
    }
  }
}

}  // namespace hvdkeras

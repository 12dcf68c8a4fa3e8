#include "core/ring_plan.h"

#include <algorithm>

namespace hvdkeras {

namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Appends block b's segments to *out.
void AddSegments(const std::vector<int64_t>& offsets, const std::vector<int64_t>& block_bytes,
                 int b, int64_t segment, bool reduce, std::vector<RingSegment>* out) {
  for (int64_t at = 0; at < block_bytes[b]; at += segment) {
    RingSegment s;
    s.offset = offsets[b] + at;
    s.bytes = std::min(segment, block_bytes[b] - at);
    s.reduce = reduce;
    out->push_back(s);
  }
}

}  // namespace

RingSchedule PlanRing(RingKind kind, int rank, int size, const std::vector<int64_t>& block_bytes,
                      int64_t element, int64_t segment_bytes) {
  RingSchedule plan;
  if (size < 2) return plan;
  std::vector<int64_t> offsets(block_bytes.size(), 0);
  for (size_t b = 1; b < block_bytes.size(); ++b) {
    offsets[b] = offsets[b - 1] + block_bytes[b - 1];
  }
  element = std::max<int64_t>(element, 1);
  const int64_t segment = std::max<int64_t>(segment_bytes / element, 1) * element;
  const bool scatter = kind != RingKind::kAllgather;
  const bool gather = kind != RingKind::kReduceScatter;
  // The blocks received, step by step (Note [ring across hosts]).
  std::vector<std::pair<int, bool>> received;  // block, reduce
  if (scatter) {
    for (int t = 0; t < size - 1; ++t) received.emplace_back(Mod(rank - t - 2, size), true);
  }
  if (gather) {
    for (int t = 0; t < size - 1; ++t) received.emplace_back(Mod(rank - t - 1, size), false);
  }
  const int first_sent = scatter ? Mod(rank - 1, size) : rank;
  AddSegments(offsets, block_bytes, first_sent, segment, false, &plan.sends);
  plan.ready_sends = static_cast<int64_t>(plan.sends.size());
  for (size_t i = 0; i < received.size(); ++i) {
    const size_t before = plan.recvs.size();
    AddSegments(offsets, block_bytes, received[i].first, segment, received[i].second,
                &plan.recvs);
    // What arrives is sent on, but for the last step's blocks.
    if (i + 1 < received.size()) {
      plan.sends.insert(plan.sends.end(), plan.recvs.begin() + before, plan.recvs.end());
    }
  }
  for (RingSegment& s : plan.sends) s.reduce = false;
  return plan;
}

int64_t RingSegmentBytes(int64_t total_bytes, int size) {
  const int64_t block = total_bytes / std::max(size, 1);
  return std::clamp<int64_t>(block / 4, int64_t{64} << 10, int64_t{1} << 20);
}

bool ParseRingSetting(const std::string& text, RingSetting* setting) {
  if (text == "auto") {
    *setting = RingSetting::kAuto;
  } else if (text == "on") {
    *setting = RingSetting::kOn;
  } else if (text == "off") {
    *setting = RingSetting::kOff;
  } else {
    return false;
  }
  return true;
}

bool RingWins(RingSetting setting, int hosts, int ranks, int64_t bytes, int64_t min_bytes) {
  if (setting == RingSetting::kOff || ranks < 2) return false;
  if (setting == RingSetting::kOn) return true;
  return hosts >= 2 && bytes >= min_bytes;
}

}  // namespace hvdkeras

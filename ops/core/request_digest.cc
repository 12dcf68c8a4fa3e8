#include "core/request_digest.h"

#include <cstring>

namespace hvdkeras {

namespace {

// FNV-1a over the fields, then a finalizer that spreads the bits.
class Hasher {
 public:
  template <typename T>
  void Add(T value) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    for (unsigned char b : bytes) state_ = (state_ ^ b) * 1099511628211ull;
  }
  void AddText(const std::string& text) {
    Add<uint64_t>(text.size());
    for (unsigned char b : text) state_ = (state_ ^ b) * 1099511628211ull;
  }
  uint64_t Finish() const {
    uint64_t z = state_ + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_ = 1469598103934665603ull;
};

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
bool Get(const char* data, size_t size, size_t* pos, T* value) {
  if (size - *pos < sizeof(T)) return false;
  std::memcpy(value, data + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

}  // namespace

uint64_t SignatureHash(const Request& r) {
  Hasher h;
  h.AddText(r.name);
  h.Add(static_cast<int32_t>(r.op_type));
  h.Add(static_cast<int32_t>(r.reduce_op));
  h.Add(r.prescale);  // the bits: -0 and 0 differ, as their text does in validation
  h.Add(r.postscale);
  h.Add(r.root_rank);
  h.Add(static_cast<int32_t>(r.device));
  h.Add(r.priority);
  h.Add<uint64_t>(r.shapes.size());
  h.Add<uint64_t>(r.dtypes.size());
  for (DataType d : r.dtypes) h.Add(static_cast<int32_t>(d));
  const bool own_rows = FirstDimMayDiffer(r.op_type);
  for (const Shape& s : r.shapes) {
    h.Add<uint64_t>(s.size());
    for (size_t d = own_rows && !s.empty() ? 1 : 0; d < s.size(); ++d) h.Add(s[d]);
  }
  h.Add<uint64_t>(r.splits.size());
  if (r.op_type != OpType::kAlltoall) {
    for (int64_t v : r.splits) h.Add(v);
  }
  return h.Finish();
}

bool AgreesWith(const Request& mine, const Request& agreed) {
  auto same_number = [](double a, double b) { return a == b || (a != a && b != b); };
  if (mine.name != agreed.name || mine.op_type != agreed.op_type ||
      mine.reduce_op != agreed.reduce_op || !same_number(mine.prescale, agreed.prescale) ||
      !same_number(mine.postscale, agreed.postscale) || mine.root_rank != agreed.root_rank ||
      mine.device != agreed.device || mine.priority != agreed.priority ||
      mine.dtypes != agreed.dtypes ||
      mine.shapes.size() != agreed.shapes.size() || mine.splits.size() != agreed.splits.size()) {
    return false;
  }
  const bool own_rows = FirstDimMayDiffer(mine.op_type);
  for (size_t t = 0; t < mine.shapes.size(); ++t) {
    const Shape& a = mine.shapes[t];
    const Shape& b = agreed.shapes[t];
    if (a.size() != b.size()) return false;
    for (size_t d = own_rows && !a.empty() ? 1 : 0; d < a.size(); ++d) {
      if (a[d] != b[d]) return false;
    }
  }
  return mine.op_type == OpType::kAlltoall || mine.splits == agreed.splits;
}

void AppendPerRankNumbers(const Request& r, std::vector<int64_t>* out) {
  if (!FirstDimMayDiffer(r.op_type)) return;
  for (const Shape& s : r.shapes) out->push_back(s.empty() ? 0 : s[0]);
  if (r.op_type == OpType::kAlltoall) out->insert(out->end(), r.splits.begin(), r.splits.end());
}

Request WithPerRankNumbers(const Request& signature, int rank, double age_seconds,
                           const int64_t* numbers, size_t count) {
  Request r = signature;
  r.rank = rank;
  r.age_seconds = age_seconds;
  if (!FirstDimMayDiffer(r.op_type)) return r;
  size_t i = 0;
  for (Shape& s : r.shapes) {
    if (i < count && !s.empty()) s[0] = numbers[i];
    ++i;
  }
  if (r.op_type == OpType::kAlltoall) {
    for (size_t k = 0; k < r.splits.size() && i < count; ++k, ++i) r.splits[k] = numbers[i];
  }
  return r;
}

std::string EncodeRequestDigests(const std::vector<Request>& requests) {
  std::string out;
  out.reserve(requests.size() * 20);
  std::vector<int64_t> numbers;
  for (const Request& r : requests) {
    numbers.clear();
    AppendPerRankNumbers(r, &numbers);
    Put<uint64_t>(&out, SignatureHash(r));
    Put<double>(&out, r.age_seconds);
    Put<uint32_t>(&out, static_cast<uint32_t>(numbers.size()));
    for (int64_t v : numbers) Put<int64_t>(&out, v);
  }
  return out;
}

bool DigestReader::Next(uint64_t* hash, double* age, std::vector<int64_t>* numbers) {
  if (!ok_ || pos_ == size_) return false;
  uint32_t count;
  if (!Get(data_, size_, &pos_, hash) || !Get(data_, size_, &pos_, age) ||
      !Get(data_, size_, &pos_, &count) || (size_ - pos_) / 8 < count) {
    ok_ = false;
    return false;
  }
  numbers->resize(count);
  if (count > 0) std::memcpy(numbers->data(), data_ + pos_, count * sizeof(int64_t));
  pos_ += count * sizeof(int64_t);
  return true;
}

std::string EncodeWanted(const std::vector<std::pair<uint64_t, int32_t>>& wanted) {
  std::string out;
  for (const auto& [hash, rank] : wanted) {
    Put<uint64_t>(&out, hash);
    Put<int32_t>(&out, rank);
  }
  return out;
}

bool DecodeWanted(const char* data, size_t size, std::vector<std::pair<uint64_t, int32_t>>* out) {
  out->clear();
  size_t pos = 0;
  while (pos < size) {
    uint64_t hash;
    int32_t rank;
    if (!Get(data, size, &pos, &hash) || !Get(data, size, &pos, &rank)) return false;
    out->emplace_back(hash, rank);
  }
  return true;
}

}  // namespace hvdkeras

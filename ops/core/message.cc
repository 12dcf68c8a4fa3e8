#include "core/message.h"

#include <cstring>

namespace hvdkeras {

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    const char* p = reinterpret_cast<const char*>(&value);
    out_.append(p, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  bool Get(T* value) {
    if (size_ - pos_ < sizeof(T)) return false;
    std::memcpy(value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n;
    if (!Get(&n) || size_ - pos_ < n) return false;
    s->assign(data_ + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == size_; }
  // Whether `count` items of `item_size` bytes can still follow.
  bool CanHold(uint64_t count, size_t item_size) const {
    return count <= (size_ - pos_) / item_size;
  }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

int64_t Request::TotalBytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    total += NumElements(shapes[i]) * static_cast<int64_t>(DataTypeSize(dtypes[i]));
  }
  return total;
}

bool Request::SameSignature(const Request& other) const {
  return name == other.name && op_type == other.op_type && reduce_op == other.reduce_op &&
         prescale == other.prescale && postscale == other.postscale &&
         root_rank == other.root_rank && device == other.device && dtypes == other.dtypes &&
         shapes == other.shapes && splits == other.splits && priority == other.priority;
}

namespace {

void PutRequest(Writer* w, const Request& r) {
  w->PutString(r.name);
  w->Put<int32_t>(r.rank);
  w->Put<int32_t>(static_cast<int32_t>(r.op_type));
  w->Put<int32_t>(static_cast<int32_t>(r.reduce_op));
  w->Put<double>(r.prescale);
  w->Put<double>(r.postscale);
  w->Put<int32_t>(r.root_rank);
  w->Put<int32_t>(static_cast<int32_t>(r.device));
  w->Put<uint32_t>(static_cast<uint32_t>(r.shapes.size()));
  for (size_t i = 0; i < r.shapes.size(); ++i) {
    w->Put<int32_t>(static_cast<int32_t>(r.dtypes[i]));
    w->Put<uint32_t>(static_cast<uint32_t>(r.shapes[i].size()));
    for (int64_t d : r.shapes[i]) w->Put<int64_t>(d);
  }
  w->Put<uint32_t>(static_cast<uint32_t>(r.splits.size()));
  for (int64_t v : r.splits) w->Put<int64_t>(v);
  w->Put<int32_t>(r.priority);
  w->Put<double>(r.age_seconds);
}

bool GetInt64s(Reader* r, std::vector<int64_t>* out) {
  uint32_t n;
  if (!r->Get(&n) || !r->CanHold(n, sizeof(int64_t))) return false;
  out->resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (!r->Get(&(*out)[i])) return false;
  }
  return true;
}

bool GetRequest(Reader* r, Request* q) {
  int32_t op_type, reduce_op, device;
  uint32_t ntensors;
  if (!r->GetString(&q->name) || !r->Get(&q->rank) || !r->Get(&op_type) ||
      !r->Get(&reduce_op) || !r->Get(&q->prescale) || !r->Get(&q->postscale) ||
      !r->Get(&q->root_rank) || !r->Get(&device) || !r->Get(&ntensors)) {
    return false;
  }
  q->op_type = static_cast<OpType>(op_type);
  q->reduce_op = static_cast<ReduceOp>(reduce_op);
  q->device = static_cast<DeviceKind>(device);
  for (uint32_t i = 0; i < ntensors; ++i) {
    int32_t dtype;
    if (!r->Get(&dtype)) return false;
    q->dtypes.push_back(static_cast<DataType>(dtype));
    Shape shape;
    uint32_t ndims;
    if (!r->Get(&ndims) || !r->CanHold(ndims, sizeof(int64_t))) return false;
    shape.resize(ndims);
    for (uint32_t d = 0; d < ndims; ++d) {
      if (!r->Get(&shape[d])) return false;
    }
    q->shapes.push_back(std::move(shape));
  }
  return GetInt64s(r, &q->splits) && r->Get(&q->priority) && r->Get(&q->age_seconds);
}

}  // namespace

std::string EncodeRequests(const std::vector<Request>& requests) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(requests.size()));
  for (const Request& r : requests) PutRequest(&w, r);
  return w.Take();
}

bool DecodeRequests(const char* data, size_t size, std::vector<Request>* out) {
  Reader r(data, size);
  uint32_t count;
  if (!r.Get(&count)) return false;
  for (uint32_t k = 0; k < count; ++k) {
    Request q;
    if (!GetRequest(&r, &q)) return false;
    out->push_back(std::move(q));
  }
  return r.done();
}

std::string EncodeResponses(const std::vector<Response>& responses) {
  Writer w;
  w.Put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const Response& r : responses) {
    w.Put<int32_t>(static_cast<int32_t>(r.kind));
    w.PutString(r.name);
    w.PutString(r.error);
    PutRequest(&w, r.agreed);
    w.Put<uint32_t>(static_cast<uint32_t>(r.sizes.size()));
    for (int64_t v : r.sizes) w.Put<int64_t>(v);
    w.Put<int32_t>(r.last_joined_rank);
  }
  return w.Take();
}

bool DecodeResponses(const char* data, size_t size, std::vector<Response>* out) {
  Reader r(data, size);
  uint32_t count;
  if (!r.Get(&count)) return false;
  for (uint32_t k = 0; k < count; ++k) {
    Response resp;
    int32_t kind;
    if (!r.Get(&kind) || !r.GetString(&resp.name) || !r.GetString(&resp.error) ||
        !GetRequest(&r, &resp.agreed) || !GetInt64s(&r, &resp.sizes) ||
        !r.Get(&resp.last_joined_rank)) {
      return false;
    }
    resp.kind = static_cast<Response::Kind>(kind);
    out->push_back(std::move(resp));
  }
  return r.done();
}

}  // namespace hvdkeras

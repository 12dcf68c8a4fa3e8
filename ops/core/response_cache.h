// The response cache behind the fast negotiation path. A request that repeats
// a cached signature is announced with one bit (its slot) instead of being
// sent to the coordinator.
//
// Note [identical response caches]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A slot number means the same entry on every rank, because every rank's
// cache starts empty and changes only through what all ranks agreed on, in
// the agreed order: entries some rank invalidated are erased everywhere,
// then hits are touched and new responses put in execution order
// (Negotiator::Negotiate). Nothing local may change it: a rank that erased or
// added an entry on its own would announce bits the others read as another
// tensor.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hvdkeras {

class ResponseCache {
 public:
  // Slots are made as entries arrive, so a cache holds (and its bit vector
  // spans) only what the job has used; `capacity` bounds that.
  explicit ResponseCache(size_t capacity = 16384);

  size_t capacity() const { return capacity_; }
  size_t size() const { return by_name_.size(); }
  // Entries dropped to make room since construction: more than zero means
  // the job runs more distinct collectives than the cache holds.
  size_t evictions() const { return evictions_; }
  // Number of slots in use or freed (an upper bound on slot indices + 1).
  size_t num_slots() const { return slots_.size(); }

  // Slot of the cached entry with this name, or -1.
  int Lookup(const std::string& name) const;
  const Request& Signature(int slot) const { return slots_[slot].signature; }
  // Names the content a slot holds now: it changes whenever the slot is put
  // or erased, so an op that found its entry at version v may keep using
  // the slot without looking its name up again while the version stays v
  // (Note [classified once]).
  uint64_t Version(int slot) const { return slots_[slot].version; }
  // True while `slot` holds the entry it held at `version`.
  bool Unchanged(int slot, uint64_t version) const {
    return slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[slot].used &&
           slots_[slot].version == version;
  }
  const Response& CachedResponse(int slot) const { return *slots_[slot].response; }
  // The same response, shared: a hit costs one reference, not a copy.
  const std::shared_ptr<const Response>& SharedResponse(int slot) const {
    return slots_[slot].response;
  }

  // Inserts a freshly executed request with the response it got (or
  // refreshes its entry), evicting the least recently used entry when full.
  // No-op when the capacity is 0.
  void Put(const Request& signature, std::shared_ptr<const Response> response);
  void Put(const Request& signature, const Response& response) {
    Put(signature, std::make_shared<const Response>(response));
  }
  // Marks a cached entry as just used.
  void Touch(int slot);
  // Removes an entry (it was invalidated by some rank).
  void Erase(int slot);

 private:
  struct Slot {
    bool used = false;
    uint64_t version = 0;
    Request signature;
    std::shared_ptr<const Response> response = std::make_shared<const Response>();
    std::list<int>::iterator lru_position;
  };

  int AllocateSlot();

  size_t capacity_;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;  // a min-heap: the smallest free slot is reused first
  size_t evictions_ = 0;
  uint64_t changes_;             // the last version handed out (see the constructor)
  std::list<int> lru_;           // front = most recently used
  std::unordered_map<std::string, int> by_name_;
};

}  // namespace hvdkeras

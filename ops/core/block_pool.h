// Memory for fused allreduce results that the engine hands to the framework
// as outputs.
//
// Note [fused outputs]
// ~~~~~~~~~~~~~~~~~~~~
// A fused allreduce reduces its tensors in one block from this pool, each
// tensor at a kBlockAlignment boundary with zeros in the gaps (the same
// layout on every rank, collective_allreduce.cc). The results are not copied
// back: each output *is* its slice of the block. The framework binding wraps
// the slice as its output tensor together with a reference to the block
// (EngineBuffer in ops/tf/kernels.cc), so the block returns to the pool when
// the last of those tensors is released, on whatever thread releases it and
// even after the engine has stopped. A training step therefore reuses the
// same pages every step instead of faulting in fresh ones for its gradients,
// and one long-lived output keeps its whole block alive.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace hvdkeras {

// Outputs inside a block start at multiples of this many bytes (what
// TensorFlow and Eigen expect of tensor data).
constexpr int64_t kBlockAlignment = 64;

inline int64_t AlignUp(int64_t bytes) {
  return (bytes + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment;
}

class BlockPool {
 public:
  // Keeps at most `cache_limit_bytes` of released blocks for reuse.
  explicit BlockPool(int64_t cache_limit_bytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes` (aligned to kBlockAlignment) that returns to
  // the pool when the last copy of the pointer is dropped, on any thread,
  // even after the pool itself is gone. Null if memory is exhausted.
  std::shared_ptr<char> Acquire(int64_t bytes);

  // Released blocks held for reuse, and their total size (for tests).
  int64_t cached_blocks() const;
  int64_t cached_bytes() const;

 private:
  struct State {
    mutable std::mutex mu;
    std::multimap<int64_t, char*> free;  // size -> block
    int64_t cached_bytes = 0;
    int64_t limit = 0;
    bool closed = false;
    ~State();
  };
  static void Release(const std::shared_ptr<State>& state, char* block, int64_t size);

  std::shared_ptr<State> state_;
};

}  // namespace hvdkeras

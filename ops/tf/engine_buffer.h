// Host memory owned by the engine (a slice of its fused buffer), wrapped as a
// TensorFlow buffer; the engine's block lives until the tensor is released.
// See Note [fused outputs] in core/block_pool.h.
#pragma once

#include <cstdint>
#include <memory>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"

namespace hvdkeras {

class EngineBuffer : public tensorflow::TensorBuffer {
 public:
  EngineBuffer(std::shared_ptr<char> owner, void* data, size_t bytes)
      : tensorflow::TensorBuffer(data), owner_(std::move(owner)), bytes_(bytes) {}
  size_t size() const override { return bytes_; }
  tensorflow::TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocator_name("hvdkeras_fused_output");
  }

 private:
  std::shared_ptr<char> owner_;
  size_t bytes_;
};

}  // namespace hvdkeras

// A measurement of the batched copy kernels (see DeviceBackend::probe_copies
// in core/device.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/common.h"

namespace hvdkeras {
namespace cuda {

// `tensors` tensors of `bytes_each` bytes each.
Status ProbeCopies(int tensors, int64_t bytes_each, int iterations, double results[3]);
// Tensors of the given sizes (bytes, each a multiple of 4): a real model's
// gradient list, whose largest tensor shares its launches with many small
// ones. results: GB/s packed and unpacked, plain copy, scaled.
Status ProbePackedCopies(const std::vector<int64_t>& sizes, int iterations, double results[3]);

}  // namespace cuda
}  // namespace hvdkeras

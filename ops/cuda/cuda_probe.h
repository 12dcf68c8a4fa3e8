// A measurement of the batched copy kernels (see DeviceBackend::probe_copies
// in core/device.h).
#pragma once

#include <cstdint>

#include "core/common.h"

namespace hvdkeras {
namespace cuda {

Status ProbeCopies(int tensors, int64_t bytes_each, int iterations, double results[3]);

}  // namespace cuda
}  // namespace hvdkeras

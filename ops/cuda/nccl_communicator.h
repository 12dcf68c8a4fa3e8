// The DeviceCommunicator (core/device.h) over NCCL: one communicator for all
// ranks, its collectives queued on the stream of one engine lane (Note
// [device lanes] in core/device.h) of this rank's GPU.
#pragma once

#include <memory>
#include <string>

#include "core/device.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_libraries.h"

namespace hvdkeras {
namespace cuda {

// Rank 0's half of making a communicator: a fresh id, as bytes.
Status NewNcclId(std::string* id);

// Every rank calls this with the id rank 0 made; it returns once all have,
// or with an error after `wait_seconds` (Note [bounded NCCL calls]; 0: no
// bound). The communicator's calls keep that bound.
Status MakeNcclCommunicator(const std::string& id, int rank, int size, const DeviceLane& where,
                            double wait_seconds, std::unique_ptr<DeviceCommunicator>* out);

// "NCCL 2.27.7 (built with 2.27.7)", or why NCCL cannot be loaded.
std::string DescribeNccl();

}  // namespace cuda
}  // namespace hvdkeras

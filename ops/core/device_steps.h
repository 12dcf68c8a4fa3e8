// The steps every GPU collective is made of (collective_device_*.cc):
// waiting for the framework's streams and releasing them (Note [stream
// order] in device.h), the fused buffer's layout, packing into it and out
// of it, and where received rows go.
#pragma once

#include <cstdint>
#include <vector>

#include "core/collectives.h"
#include "core/device_packing.h"

namespace hvdkeras {
namespace device_steps {

// Fused buffers put each tensor at a multiple of this (what NCCL and the
// copy kernels handle fastest; a multiple of every element size).
constexpr int64_t kDeviceAlignment = 256;

// Scratch buffers that live at the same time within one batch.
enum ScratchSlot { kFusionSlot = 0, kNeutralSlot = 1 };

// What the communicator reduces with: an average is a sum, divided on the
// device afterwards (CopyFinalized), exactly as the CPU path rounds it.
inline ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// The error for a GPU batch without a device (an engine bug).
Status NoDevice();

// The engine stream waits for every input's ready event (recorded when the
// op was queued, after its framework-allocated outputs existed).
Status WaitForInputs(ExecContext& ctx, const std::vector<PendingOp*>& batch);

// Outputs allocated now, on the engine thread, come from the framework's
// allocator: the engine stream waits for what their framework streams have
// queued so far before writing them.
Status WaitForNewOutputs(ExecContext& ctx, const std::vector<PendingOp*>& batch);

// Every framework stream of the batch waits for the engine stream's work.
Status ReleaseStreams(ExecContext& ctx, const std::vector<PendingOp*>& batch);

std::vector<TensorRef*> TensorsOf(const std::vector<PendingOp*>& batch);

// Copies element ranges of the tensors into a fused buffer at their planned
// offsets (`into`), or out of it, as src / divisor * factor (a divisor of 1
// only scales: Device::CopyFinalized). Stand-ins contribute the neutral
// element and receive nothing.
Status PackOrUnpack(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                    const PackingPlan& plan, char* buffer, DataType dtype, int divisor,
                    double factor, bool into, ReduceOp neutral_op);

// The fused buffer's pieces copied out to the outputs (`copies`, in
// elements of `dtype`), divided and scaled on the way as PackOrUnpack does,
// timed as the unpack; nothing when there are none.
Status CopyOut(ExecContext& ctx, const std::vector<PendingOp*>& batch, DataType dtype,
               const std::vector<DeviceCopy>& copies, int divisor = 1, double factor = 1.0);

// Where each tensor's received rows go: its output, allocated now by the
// framework, or for a joined rank's stand-in (whose result is dropped) a
// part of one device scratch buffer, taken once for the whole batch. An
// output the framework failed to allocate also gets scratch, and the first
// such failure goes to `allocation`: the caller still exchanges, then
// returns it (Note [a failed output allocation still takes part] in
// collectives.h). The returned status is the scratch memory's.
Status ReceiveBuffers(ExecContext& ctx, const std::vector<TensorRef*>& tensors,
                      const std::vector<Shape>& shapes, std::vector<char*>* out,
                      Status* allocation);

// The fused layout of `tensors` (each at a multiple of kDeviceAlignment)
// and a device scratch buffer that holds it.
Status FusedBuffer(ExecContext& ctx, const std::vector<TensorRef*>& tensors, PackingPlan* plan,
                   char** buffer);

}  // namespace device_steps
}  // namespace hvdkeras

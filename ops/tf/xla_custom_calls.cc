// The collectives inside XLA-compiled functions: XLA custom-call targets on
// the host platform that hand XLA's buffers to the engine and return when
// the collective completed.
//
// Note [xla collectives]
// ~~~~~~~~~~~~~~~~~~~~~~
// Inside `tf.function(jit_compile=True)` (and Keras's `jit_compile`), the
// Python wrappers emit TensorFlow's XlaCustomCallV2 op instead of the
// Hvdkeras* ops (hvdkeras/collectives/xla_calls.py); XLA compiles it into a
// call of the target registered here, with the call described by a text
// `backend_config` ("name=value" lines, written by xla_calls.py and parsed
// by ParseCall below: change both together). The target blocks XLA's thread
// until the engine completes the collective, so the compiled step keeps the
// order XLA chose, and the other ranks' steps meet it by name as in graph
// mode. On a GPU (builds with the GPU part) the same names are registered
// for the CUDA platform: XLA hands its stream and device buffers, which go to
// the engine as GPU tensors produced and consumed on that stream (Note
// [stream order] in core/device.h), so the call blocks only until the
// engine has queued the collective and made XLA's stream wait for it.
// Built only when TensorFlow ships XLA's custom-call headers
// (HVDKERAS_HAS_XLA_CALLS); `hvdkeras_xla_calls_built()` tells Python, and
// `hvdkeras_xla_gpu_calls_built()` whether the GPU targets exist.
#if __has_include("xla/service/custom_call_target_registry.h") && \
    __has_include("xla/service/custom_call_status_internal.h")
#define HVDKERAS_HAS_XLA_CALLS 1
#else
#define HVDKERAS_HAS_XLA_CALLS 0
#endif

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/engine_api.h"

#if HVDKERAS_HAS_XLA_CALLS
#include "xla/service/custom_call_status_internal.h"
#include "xla/service/custom_call_target_registry.h"

namespace hvdkeras {
namespace {

struct XlaCall {
  std::string name;
  int32_t reduce_op = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  int root_rank = 0;
  int process_set = 0;
  DataType dtype = DataType::kFloat32;
  std::vector<Shape> shapes;  // one per tensor
};

bool ParseShape(const std::string& text, Shape* shape) {
  shape->clear();
  if (text.empty()) return true;  // a scalar
  std::stringstream dims(text);
  std::string dim;
  while (std::getline(dims, dim, ',')) {
    char* end = nullptr;
    const long long value = std::strtoll(dim.c_str(), &end, 10);
    if (end == dim.c_str() || *end != '\0' || value < 0) return false;
    shape->push_back(value);
  }
  return true;
}

// See Note [xla collectives] for the format.
bool ParseCall(const char* opaque, size_t length, XlaCall* call, std::string* error) {
  std::stringstream lines(std::string(opaque, length));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq);
    const std::string value = line.substr(eq + 1);
    if (key == "name") {
      call->name = value;
    } else if (key == "reduce_op") {
      call->reduce_op = std::atoi(value.c_str());
    } else if (key == "prescale") {
      call->prescale = std::strtod(value.c_str(), nullptr);
    } else if (key == "postscale") {
      call->postscale = std::strtod(value.c_str(), nullptr);
    } else if (key == "root_rank") {
      call->root_rank = std::atoi(value.c_str());
    } else if (key == "process_set") {
      call->process_set = std::atoi(value.c_str());
    } else if (key == "dtype") {
      call->dtype = static_cast<DataType>(std::atoi(value.c_str()));
    } else if (key == "shape") {
      Shape shape;
      if (!ParseShape(value, &shape)) {
        *error = "bad shape '" + value + "' in the call's description";
        return false;
      }
      call->shapes.push_back(shape);
    }
  }
  if (call->name.empty() || call->shapes.empty()) {
    *error = "the call's description lacks a name or tensors";
    return false;
  }
  return true;
}

// XLA hands one output buffer directly, several as an array of buffers.
std::vector<void*> OutputBuffers(void* out, size_t count) {
  if (count == 1) return {out};
  void** buffers = static_cast<void**>(out);
  return std::vector<void*>(buffers, buffers + count);
}

std::vector<TensorRef> Refs(const XlaCall& call, const void** in, void* out) {
  const std::vector<void*> outputs = OutputBuffers(out, call.shapes.size());
  std::vector<TensorRef> refs(call.shapes.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    refs[i].input = in[i];
    refs[i].output = outputs[i];
    refs[i].dtype = call.dtype;
    refs[i].shape = call.shapes[i];
  }
  return refs;
}

// XlaCustomCallStatusSetFailure is not exported by TensorFlow's libraries;
// the status is the struct its header declares, failed when it has a message.
void Report(const Status& s, XlaCustomCallStatus* status) {
  if (!s.ok()) status->message = s.message;
}

using Enqueue = Status (*)(const XlaCall&, std::vector<TensorRef>, DoneCallback);
// Makes the call's tensors from the buffers XLA handed over.
using MakeRefs = std::function<Status(const XlaCall&, std::vector<TensorRef>*)>;

Status QueueAllreduce(const XlaCall& c, std::vector<TensorRef> refs, DoneCallback done) {
  return EnqueueAllreduce(c.name, std::move(refs), static_cast<ReduceOp>(c.reduce_op),
                          c.prescale, c.postscale, c.process_set, std::move(done));
}

Status QueueBroadcast(const XlaCall& c, std::vector<TensorRef> refs, DoneCallback done) {
  return EnqueueBroadcast(c.name, std::move(refs), c.root_rank, c.process_set, std::move(done));
}

// One target's body: parse the call, queue the collective on XLA's buffers
// and wait until the engine is done with it (on a GPU: until XLA's stream
// waits for the results, Note [stream order]; nothing waits for the GPU).
void RunCall(const char* what, Enqueue enqueue, const MakeRefs& make_refs, const char* opaque,
             size_t length, XlaCustomCallStatus* status) {
  XlaCall call;
  std::string error;
  if (!ParseCall(opaque, length, &call, &error)) {
    Report(Status::Error(StatusCode::kInvalidArgument,
                         std::string("hvdkeras XLA ") + what + ": " + error),
           status);
    return;
  }
  std::vector<TensorRef> refs;
  Status made = make_refs(call, &refs);
  if (!made.ok()) {
    Report(made, status);
    return;
  }
  std::promise<Status> finished;
  std::future<Status> result = finished.get_future();
  Status queued = enqueue(call, std::move(refs),
                          [&finished](const Status& s) { finished.set_value(s); });
  Report(queued.ok() ? result.get() : queued, status);
}

MakeRefs HostRefs(void* out, const void** in) {
  return [out, in](const XlaCall& call, std::vector<TensorRef>* refs) {
    *refs = Refs(call, in, out);
    return Status::OK();
  };
}

void Allreduce(void* out, const void** in, const char* opaque, size_t length,
               XlaCustomCallStatus* status) {
  RunCall("allreduce", &QueueAllreduce, HostRefs(out, in), opaque, length, status);
}

void Broadcast(void* out, const void** in, const char* opaque, size_t length,
               XlaCustomCallStatus* status) {
  RunCall("broadcast", &QueueBroadcast, HostRefs(out, in), opaque, length, status);
}

#if HVDKERAS_CUDA
// GPU targets: XLA passes its stream and one array of device buffers, the
// operands first and then the results.
MakeRefs DeviceRefs(void* stream, void** buffers) {
  return [stream, buffers](const XlaCall& call, std::vector<TensorRef>* refs) {
    const size_t count = call.shapes.size();
    const DeviceBackend* backend = GetDeviceBackend();
    std::string why;
    Device* device = backend ? backend->device(&why) : nullptr;
    if (device == nullptr) {
      return Status::Error(StatusCode::kPreconditionError,
                           "hvdkeras XLA on a GPU, but no GPU is usable: " + why);
    }
    const void* any = nullptr;
    for (size_t i = 0; i < 2 * count && any == nullptr; ++i) any = buffers[i];
    if (any == nullptr) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "hvdkeras XLA on a GPU: every tensor of '" + call.name +
                               "' is empty; leave such collectives out of the compiled step");
    }
    int ordinal = -1;
    Status s = device->PointerDevice(any, &ordinal);
    if (!s.ok()) return s;
    refs->assign(count, TensorRef());
    for (size_t i = 0; i < count; ++i) {
      TensorRef& ref = (*refs)[i];
      ref.input = buffers[i];
      ref.output = buffers[count + i];
      ref.dtype = call.dtype;
      ref.shape = call.shapes[i];
      ref.device = ordinal;
      ref.framework_stream = stream;
    }
    return Status::OK();
  };
}

void DeviceAllreduce(void* stream, void** buffers, const char* opaque, size_t length,
                     XlaCustomCallStatus* status) {
  RunCall("allreduce", &QueueAllreduce, DeviceRefs(stream, buffers), opaque, length, status);
}

void DeviceBroadcast(void* stream, void** buffers, const char* opaque, size_t length,
                     XlaCustomCallStatus* status) {
  RunCall("broadcast", &QueueBroadcast, DeviceRefs(stream, buffers), opaque, length, status);
}
#endif  // HVDKERAS_CUDA

struct Registration {
  Registration() {
    auto* registry = xla::CustomCallTargetRegistry::Global();
    registry->Register("hvdkeras_allreduce", reinterpret_cast<void*>(&Allreduce), "Host");
    registry->Register("hvdkeras_broadcast", reinterpret_cast<void*>(&Broadcast), "Host");
#if HVDKERAS_CUDA
    registry->Register("hvdkeras_allreduce", reinterpret_cast<void*>(&DeviceAllreduce), "CUDA");
    registry->Register("hvdkeras_broadcast", reinterpret_cast<void*>(&DeviceBroadcast), "CUDA");
#endif
  }
};
const Registration registration;

}  // namespace
}  // namespace hvdkeras
#endif  // HVDKERAS_HAS_XLA_CALLS

// Whether this library registered its XLA custom-call targets (1) or not (0).
extern "C" int hvdkeras_xla_calls_built() { return HVDKERAS_HAS_XLA_CALLS; }
// Whether it registered them for GPUs as well.
extern "C" int hvdkeras_xla_gpu_calls_built() {
#if HVDKERAS_CUDA
  return HVDKERAS_HAS_XLA_CALLS;
#else
  return 0;
#endif
}

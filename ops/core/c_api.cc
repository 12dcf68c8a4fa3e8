// C entry points for Python (ctypes): start and stop the engine on a
// communicator handed over from mpi4py as a Fortran handle, and describe
// what this library was built with and the vocabulary it speaks.
#include <mpi.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/engine.h"
#include "core/engine_settings.h"
#include "core/watchdog.h"

namespace {

std::string VocabularyText() {
  std::string text;
#define HVDKERAS_DTYPE(enumerator, value, name, bytes, reducible, floating, tensorflow)   \
  text += std::string("dtype ") + name + " " + std::to_string(value) + " " + #bytes + " " + \
          (reducible ? "reducible" : "movable") + "\n";
#define HVDKERAS_REDUCE_OP(enumerator, value, name) \
  text += std::string("reduce_op ") + name + " " + std::to_string(value) + "\n";
#include "core/types.def"
  return text;
}

}  // namespace

using hvdkeras::CopyText;

extern "C" {

// Starts the engine with `settings`, "name=value" lines naming fields of the
// engine's configuration (see Note [engine settings] in engine_settings.def;
// settings not named keep their defaults). Returns 0 on success; otherwise
// writes a message into `error`.
int hvdkeras_engine_start(int fortran_comm, const char* settings, char* error,
                          int error_capacity) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    CopyText("MPI is not initialized in this process (mpi4py should have done it)", error,
              error_capacity);
    return 1;
  }
  hvdkeras::EngineConfig config;
  hvdkeras::Status s = hvdkeras::ParseEngineSettings(settings ? settings : "", &config);
  if (s.ok()) {
    MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm));
    s = hvdkeras::Engine::Instance().Start(comm, config);
    // See Note [bounded waits] in watchdog.h.
    if (s.ok()) {
      s = hvdkeras::Watchdog::Instance().Start(
          comm, config.stall_shutdown_seconds,
          hvdkeras::LivenessBound(config.liveness_seconds, config.stall_shutdown_seconds));
      // Every rank got the same refusal: each stops its own engine.
      if (!s.ok()) hvdkeras::Engine::Instance().Stop();
    }
  }
  if (!s.ok()) {
    CopyText(s.message, error, error_capacity);
    return 1;
  }
  return 0;
}

// The default settings, as "name=value" lines in the table's order.
const char* hvdkeras_engine_default_settings() {
  static const std::string text = hvdkeras::DescribeEngineSettings(hvdkeras::EngineConfig());
  return text.c_str();
}

// The element types and reductions (see Note [wire vocabulary] in
// types.def), one per line: "dtype NAME VALUE BYTES reducible|movable" and
// "reduce_op NAME VALUE".
const char* hvdkeras_vocabulary() {
  static const std::string text = VocabularyText();
  return text.c_str();
}

void hvdkeras_engine_stop() {
  hvdkeras::Engine::Instance().Stop();
  hvdkeras::Watchdog::Instance().Stop();
}

// What this process's framework thread is doing, for other ranks that ask
// (Note [bounded waits] in watchdog.h); "" when it runs its own code.
void hvdkeras_set_activity(const char* what) {
  hvdkeras::Watchdog::Instance().SetActivity(what ? what : "");
}

// Asks ranks[0..count) what they are doing, waiting at most `wait_seconds`;
// writes one "RANK<TAB>ANSWER" line per rank into `out`.
void hvdkeras_ask_ranks(const int* ranks, int count, double wait_seconds, char* out,
                        int capacity) {
  std::vector<int> asked(ranks, ranks + std::max(count, 0));
  std::string text;
  for (const auto& [rank, answer] : hvdkeras::Watchdog::Instance().Ask(asked, wait_seconds)) {
    std::string line = answer;
    for (char& c : line) {
      if (c == '\n') c = ' ';
    }
    text += std::to_string(rank) + "\t" + line + "\n";
  }
  CopyText(text, out, capacity);
}

// Starts process set `id` (> 0) on the communicator of its ranks, with the
// same settings lines as hvdkeras_engine_start (see Note [process set
// engines] in engine.h). Collective over the set. Returns 0 or 1 with a
// message in `error`.
int hvdkeras_process_set_start(int id, int fortran_comm, const char* settings, char* error,
                               int error_capacity) {
  hvdkeras::EngineConfig config;
  hvdkeras::Status s = hvdkeras::ParseEngineSettings(settings ? settings : "", &config);
  if (s.ok()) {
    MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm));
    s = hvdkeras::Engine::StartSet(id, comm, config);
  }
  if (!s.ok()) {
    CopyText(s.message, error, error_capacity);
    return 1;
  }
  return 0;
}

// Stops process set `id` on this rank (collective over the set).
void hvdkeras_process_set_stop(int id) { hvdkeras::Engine::StopSet(id); }

int hvdkeras_engine_running() { return hvdkeras::Engine::Instance().running() ? 1 : 0; }

// Starts tracing to `path` (rank 0 writes), or stops it when path is empty.
void hvdkeras_set_timeline(const char* path, int mark_cycles) {
  hvdkeras::Engine::Instance().SetTimeline(path ? path : "", mark_cycles != 0);
}

// The fusion threshold and cycle time in use (they change under autotune).
void hvdkeras_current_params(int64_t* fusion_threshold, double* cycle_time_ms) {
  hvdkeras::Engine::Instance().CurrentParams(fusion_threshold, cycle_time_ms);
}

// The global set's totals since init(): counts[4] (ops, batches, bytes
// reduced, bytes gathered) and seconds[2] (executing, negotiating with ops
// pending).
void hvdkeras_engine_stats(int64_t* counts, double* seconds) {
  hvdkeras::Engine::Instance().Stats(counts, seconds);
}

// The global set's negotiation totals since init(): counts[6] (cycles, ops
// agreed from the response cache, ops agreed through rank 0, cache
// evictions, bytes of requests rank 0 received, the negotiation's own CPU
// nanoseconds outside its exchanges).
void hvdkeras_negotiation_stats(int64_t* counts) {
  hvdkeras::Engine::Instance().NegotiationStats(counts);
}

// Sockets this rank holds for host liveness (Note [liveness tree]).
int hvdkeras_liveness_sockets() { return hvdkeras::Watchdog::Instance().LivenessSockets(); }

// How large CPU allreduces of the global set go: "shm", "hierarchical" or
// "mpi" (see Note [hierarchical allreduce] in allreduce_path.h).
const char* hvdkeras_allreduce_path() { return hvdkeras::Engine::Instance().allreduce_path(); }

// What the library was built with, for `hvdkeras check`: "cpu", or the
// device backend compiled in ("cuda").
const char* hvdkeras_build_flavor() {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  return backend ? backend->name : "cpu";
}

// The GPU functions below answer for a build with a device backend; without
// one they report that there is none.

// Directories (colon-separated) searched for the GPU runtime libraries.
void hvdkeras_gpu_set_library_dirs(const char* dirs) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (backend) backend->set_library_dirs(dirs ? dirs : "");
}

// Where the GPU part keeps compiled kernels between runs.
void hvdkeras_gpu_set_kernel_cache_dir(const char* dir) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (backend && backend->set_kernel_cache_dir) backend->set_kernel_cache_dir(dir ? dir : "");
}

// The GPU this process was pinned to (hvdkeras.pin_gpu()), made ready now:
// its engine lane's stream and the kernels (compiled or read from the
// cache), so the first collective pays for neither. Returns 0, or 1 with
// the reason in `text` (the first collective then reports it too).
int hvdkeras_gpu_pin(int device, char* text, int capacity) {
  hvdkeras::SetPinnedDevice(device);
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (!backend) {
    CopyText(hvdkeras::kNoGpuPart, text, capacity);
    return 1;
  }
  std::string why;
  hvdkeras::Device* gpu = backend->device(&why);
  hvdkeras::Status s = gpu ? gpu->Prepare({device, 0})
                           : hvdkeras::Status::Error(hvdkeras::StatusCode::kPreconditionError, why);
  CopyText(s.message, text, capacity);
  return s.ok() ? 0 : 1;
}

// The GPUs this process can use: their number, with a description in
// `text`; or -1 with the reason there are none.
int hvdkeras_gpu_probe(char* text, int capacity) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (!backend) {
    CopyText(hvdkeras::kNoGpuPart, text, capacity);
    return -1;
  }
  std::string why;
  hvdkeras::Device* device = backend->device(&why);
  if (!device) {
    CopyText(why, text, capacity);
    return -1;
  }
  CopyText(device->Describe(), text, capacity);
  return device->DeviceCount();
}

// "name=value" lines: what the GPU part was built with and the runtime
// libraries it finds. Returns 0, or 1 when there is no GPU part.
int hvdkeras_gpu_build_info(char* text, int capacity) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  CopyText(backend ? backend->build_info() : "", text, capacity);
  return backend ? 0 : 1;
}

// Compiles the GPU kernels for `arch` ("sm_90") without a GPU. Returns 0
// with their size in `text`, or 1 with the compiler's error.
int hvdkeras_gpu_compile_kernels(const char* arch, char* text, int capacity) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (!backend) {
    CopyText(hvdkeras::kNoGpuPart, text, capacity);
    return 1;
  }
  int64_t bytes = 0;
  hvdkeras::Status s = backend->compile_kernels(arch ? arch : "", &bytes);
  CopyText(s.ok() ? std::to_string(bytes) : s.message, text, capacity);
  return s.ok() ? 0 : 1;
}

// Measures the GPU copy kernels (DeviceBackend::probe_copies): fills
// `results` (GB/s: packed, plain copy, scaled) and returns 0, or returns 1
// with the reason in `text`.
int hvdkeras_gpu_probe_copies(int tensors, int64_t bytes_each, int iterations, double* results,
                              char* text, int capacity) {
  const hvdkeras::DeviceBackend* backend = hvdkeras::GetDeviceBackend();
  if (!backend) {
    CopyText(hvdkeras::kNoGpuPart, text, capacity);
    return 1;
  }
  hvdkeras::Status s = backend->probe_copies(tensors, bytes_each, iterations, results);
  CopyText(s.message, text, capacity);
  return s.ok() ? 0 : 1;
}

}  // extern "C"

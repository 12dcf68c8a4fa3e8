// C entry points for Python (ctypes): start and stop the engine on a
// communicator handed over from mpi4py as a Fortran handle.
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/engine.h"

namespace {

void CopyError(const std::string& message, char* out, int capacity) {
  if (!out || capacity <= 0) return;
  const size_t n = std::min(message.size(), static_cast<size_t>(capacity - 1));
  std::memcpy(out, message.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" {

// Returns 0 on success; otherwise writes a message into `error`.
int hvdkeras_engine_start(int fortran_comm, int64_t fusion_threshold, double cycle_time_ms,
                          int cache_capacity, double stall_check_seconds,
                          double stall_shutdown_seconds, const char* timeline_path,
                          int timeline_mark_cycles, int autotune, int autotune_threshold_fixed,
                          int autotune_cycle_time_fixed, const char* autotune_log,
                          int64_t allreduce_chunk_bytes, int shm_allreduce, char* error,
                          int error_capacity) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    CopyError("MPI is not initialized in this process (mpi4py should have done it)", error,
              error_capacity);
    return 1;
  }
  hvdkeras::EngineConfig config;
  config.fusion_threshold = fusion_threshold;
  config.cycle_time_ms = cycle_time_ms;
  config.cache_capacity = cache_capacity;
  config.stall_check_seconds = stall_check_seconds;
  config.stall_shutdown_seconds = stall_shutdown_seconds;
  config.timeline_path = timeline_path ? timeline_path : "";
  config.timeline_mark_cycles = timeline_mark_cycles != 0;
  config.autotune = autotune != 0;
  config.autotune_threshold_fixed = autotune_threshold_fixed != 0;
  config.autotune_cycle_time_fixed = autotune_cycle_time_fixed != 0;
  config.autotune_log = autotune_log ? autotune_log : "";
  config.allreduce_chunk_bytes = allreduce_chunk_bytes;
  config.shm_allreduce = shm_allreduce != 0;
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm));
  hvdkeras::Status s = hvdkeras::Engine::Instance().Start(comm, config);
  if (!s.ok()) {
    CopyError(s.message, error, error_capacity);
    return 1;
  }
  return 0;
}

void hvdkeras_engine_stop() { hvdkeras::Engine::Instance().Stop(); }

int hvdkeras_engine_running() { return hvdkeras::Engine::Instance().running() ? 1 : 0; }

// Starts tracing to `path` (rank 0 writes), or stops it when path is empty.
void hvdkeras_set_timeline(const char* path, int mark_cycles) {
  hvdkeras::Engine::Instance().SetTimeline(path ? path : "", mark_cycles != 0);
}

// The fusion threshold and cycle time in use (they change under autotune).
void hvdkeras_current_params(int64_t* fusion_threshold, double* cycle_time_ms) {
  hvdkeras::Engine::Instance().CurrentParams(fusion_threshold, cycle_time_ms);
}

// What the library was built with, for `hvdkeras check`.
const char* hvdkeras_build_flavor() { return "cpu"; }

}  // extern "C"

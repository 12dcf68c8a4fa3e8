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
                          int cache_capacity, char* error, int error_capacity) {
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

// What the library was built with, for `hvdkeras check`.
const char* hvdkeras_build_flavor() { return "cpu"; }

}  // extern "C"

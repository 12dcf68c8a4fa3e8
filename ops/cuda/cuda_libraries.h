// The CUDA runtime, the CUDA driver, NVRTC and NCCL, loaded with dlopen the
// first time something needs them. Linking none of them keeps one op library
// loadable everywhere: on a machine without a GPU or driver it works as a CPU
// build, and it uses whichever libraries TensorFlow itself loads (the NVIDIA
// pip wheels or the system's). The headers (from TensorFlow's wheel or the
// NCCL wheel) give only the functions' types.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nvrtc.h>

#include <string>

namespace hvdkeras {
namespace cuda {

#define HVDKERAS_RUNTIME_FUNCTIONS(X)                                                     \
  X(cudaGetDeviceCount) X(cudaGetDevice) X(cudaSetDevice) X(cudaFree) X(cudaFreeAsync)     \
  X(cudaMemsetAsync) X(cudaStreamCreateWithFlags)                                          \
  X(cudaStreamSynchronize) X(cudaEventCreateWithFlags) X(cudaEventRecord)                 \
  X(cudaEventDestroy) X(cudaStreamWaitEvent) X(cudaGetErrorString) X(cudaGetLastError)     \
  X(cudaRuntimeGetVersion) X(cudaDriverGetVersion) X(cudaDeviceGetAttribute)               \
  X(cudaDeviceGetPCIBusId) X(cudaMemcpyAsync) X(cudaEventElapsedTime) X(cudaEventSynchronize) \
  X(cudaPointerGetAttributes) X(cudaStreamQuery) X(cudaDeviceGetStreamPriorityRange)          \
  X(cudaStreamCreateWithPriority) X(cudaStreamDestroy) X(cudaStreamGetPriority) X(cudaEventQuery)

#define HVDKERAS_DRIVER_FUNCTIONS(X)                                                      \
  X(cuInit) X(cuDeviceGet) X(cuDeviceGetName) X(cuModuleLoadData) X(cuModuleGetFunction)   \
  X(cuLaunchKernel) X(cuGetErrorString) X(cuCtxGetCurrent) X(cuCtxSetCurrent)                \
  X(cuDevicePrimaryCtxGetState)

#define HVDKERAS_NVRTC_FUNCTIONS(X)                                                       \
  X(nvrtcVersion) X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize)   \
  X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN) X(nvrtcDestroyProgram)       \
  X(nvrtcGetErrorString)

#define HVDKERAS_NCCL_FUNCTIONS(X)                                                        \
  X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy)              \
  X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclAllReduce) X(ncclBroadcast) X(ncclSend)  \
  X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd) X(ncclGetErrorString)                     \
  X(ncclCommInitRankConfig) X(ncclCommFinalize) X(ncclReduceScatter) X(ncclAllGather)

#define HVDKERAS_FUNCTION_POINTER(name) decltype(&::name) name = nullptr;

// cuda_runtime.h adds C++ templates under these names, so their C
// signatures are spelled out.
#define HVDKERAS_RUNTIME_OVERLOADED(X)                       \
  X(cudaMalloc, cudaError_t (*)(void**, size_t))             \
  X(cudaMallocAsync, cudaError_t (*)(void**, size_t, cudaStream_t))

template <typename T>
using FunctionPointer = T;
#define HVDKERAS_TYPED_FUNCTION_POINTER(name, type) FunctionPointer<type> name = nullptr;

struct Runtime {
  HVDKERAS_RUNTIME_FUNCTIONS(HVDKERAS_FUNCTION_POINTER)
  HVDKERAS_RUNTIME_OVERLOADED(HVDKERAS_TYPED_FUNCTION_POINTER)
};
struct Driver {
  HVDKERAS_DRIVER_FUNCTIONS(HVDKERAS_FUNCTION_POINTER)
};
struct Nvrtc {
  HVDKERAS_NVRTC_FUNCTIONS(HVDKERAS_FUNCTION_POINTER)
};
struct Nccl {
  HVDKERAS_NCCL_FUNCTIONS(HVDKERAS_FUNCTION_POINTER)
};

#undef HVDKERAS_FUNCTION_POINTER
#undef HVDKERAS_TYPED_FUNCTION_POINTER

// Directories searched (in order, after libraries the process has already
// loaded) for the shared libraries: the Python package passes the NVIDIA
// wheels' lib/ folders. Colon-separated; takes effect for libraries not yet
// loaded.
void SetLibraryDirs(const std::string& dirs);

// Each returns the loaded table, or null with the reason in *why (the
// library or one of its functions was not found). Loaded once; thread-safe.
const Runtime* LoadRuntime(std::string* why);
const Driver* LoadDriver(std::string* why);
const Nvrtc* LoadNvrtc(std::string* why);
const Nccl* LoadNccl(std::string* why);

// Where a loaded library came from ("" if not loaded): for `hvdkeras check`.
std::string LoadedFrom(const char* soname);

}  // namespace cuda
}  // namespace hvdkeras

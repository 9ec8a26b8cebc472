// The CUDA runtime (libcudart), loaded with dlopen at run time and never linked.
//
// Restates the few C types and entry points sluice uses, so the build never needs the CUDA
// headers. Internal: mem::open_cuda_target is the public way in.
#pragma once

#include <string>

#include "sluice/core/status.h"

namespace sluice::shim {

using cudaError_t = int;
using cudaStream_t = void*;
using cudaEvent_t = void*;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr cudaError_t kErrorNotReady = 600;

struct CudaApi {
  void* lib = nullptr;
  std::string loaded;  // the library name that loaded ("libcudart.so.13")
  cudaError_t (*GetDeviceCount)(int*) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*HostAlloc)(void**, size_t, unsigned) = nullptr;
  cudaError_t (*FreeHost)(void*) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned) = nullptr;
  cudaError_t (*StreamDestroy)(cudaStream_t) = nullptr;
  cudaError_t (*EventCreateWithFlags)(cudaEvent_t*, unsigned) = nullptr;
  cudaError_t (*EventDestroy)(cudaEvent_t) = nullptr;
  cudaError_t (*EventRecord)(cudaEvent_t, cudaStream_t) = nullptr;
  cudaError_t (*EventQuery)(cudaEvent_t) = nullptr;
  cudaError_t (*EventSynchronize)(cudaEvent_t) = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
};

// The names tried when no library is given, newest major version first.
inline constexpr const char* kCudartNames[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                               "libcudart.so.11.0"};

// Loads `library`, or the first of kCudartNames that loads. Unsupported, naming every
// library tried and why, when none does or one lacks an entry point.
Result<CudaApi> load_cudart(const std::string& library);

}  // namespace sluice::shim

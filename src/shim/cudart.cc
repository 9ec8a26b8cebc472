#include "shim/cudart.h"

#include <dlfcn.h>

#include <iterator>
#include <vector>

namespace sluice::shim {
namespace {

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

}  // namespace

Result<CudaApi> load_cudart(const std::string& library) {
  std::vector<std::string> names;
  if (!library.empty())
    names.push_back(library);
  else
    names.assign(std::begin(kCudartNames), std::end(kCudartNames));
  CudaApi api;
  std::string tried;
  for (auto& n : names) {
    api.lib = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.lib) {
      api.loaded = n;
      break;
    }
    const char* err = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(err ? err : n);
  }
  if (!api.lib) return fail(Code::kUnsupported, "CUDA runtime not found (" + tried + ")");
  std::string missing;
  resolve(api.lib, "cudaGetDeviceCount", api.GetDeviceCount, missing);
  resolve(api.lib, "cudaSetDevice", api.SetDevice, missing);
  resolve(api.lib, "cudaMalloc", api.Malloc, missing);
  resolve(api.lib, "cudaFree", api.Free, missing);
  resolve(api.lib, "cudaHostAlloc", api.HostAlloc, missing);
  resolve(api.lib, "cudaFreeHost", api.FreeHost, missing);
  resolve(api.lib, "cudaMemcpyAsync", api.MemcpyAsync, missing);
  resolve(api.lib, "cudaStreamCreateWithFlags", api.StreamCreateWithFlags, missing);
  resolve(api.lib, "cudaStreamDestroy", api.StreamDestroy, missing);
  resolve(api.lib, "cudaEventCreateWithFlags", api.EventCreateWithFlags, missing);
  resolve(api.lib, "cudaEventDestroy", api.EventDestroy, missing);
  resolve(api.lib, "cudaEventRecord", api.EventRecord, missing);
  resolve(api.lib, "cudaEventQuery", api.EventQuery, missing);
  resolve(api.lib, "cudaEventSynchronize", api.EventSynchronize, missing);
  resolve(api.lib, "cudaGetErrorString", api.GetErrorString, missing);
  if (!missing.empty()) {
    ::dlclose(api.lib);
    return fail(Code::kUnsupported, "CUDA runtime lacks " + missing);
  }
  return api;
}

}  // namespace sluice::shim

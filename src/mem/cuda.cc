// CUDA device memory through libcudart, loaded with dlopen at run time.
//
// Only the handful of runtime entry points sluice needs are resolved, with their C
// signatures restated here (the CUDA headers are never needed to build). Copies go on one
// non-blocking stream; each copy records an event from a ring, and a ticket's completion
// is that event's.
#include <dlfcn.h>

#include <array>
#include <mutex>
#include <vector>

#include "sluice/mem_target.h"

namespace sluice::mem {
namespace {

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

template <typename F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn) missing += std::string(missing.empty() ? "" : ", ") + name;
  return fn != nullptr;
}

Result<CudaApi> load_cudart(const std::string& library) {
  std::vector<std::string> names;
  if (!library.empty())
    names.push_back(library);
  else
    names = {"libcudart.so", "libcudart.so.12", "libcudart.so.11.0"};
  CudaApi api;
  std::string tried;
  for (auto& n : names) {
    api.lib = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.lib) break;
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

class CudaTarget final : public Target {
 public:
  static constexpr size_t kEvents = 256;

  CudaTarget(CudaApi api, int device) : api_(api), device_(device) {}
  ~CudaTarget() override {
    for (auto e : events_)
      if (e) api_.EventDestroy(e);
    if (stream_) api_.StreamDestroy(stream_);
    // The library stays loaded: CUDA does not support being unloaded mid-process.
  }

  Status init() {
    SLUICE_RETURN_IF_ERROR(check(api_.SetDevice(device_), "cudaSetDevice"));
    SLUICE_RETURN_IF_ERROR(
        check(api_.StreamCreateWithFlags(&stream_, kStreamNonBlocking), "cudaStreamCreate"));
    for (auto& e : events_)
      SLUICE_RETURN_IF_ERROR(
          check(api_.EventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreate"));
    return ok();
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  MemoryKind kind() const override { return MemoryKind::kDevice; }

  Result<Allocation> allocate(size_t bytes) override {
    void* p = nullptr;
    SLUICE_RETURN_IF_ERROR(check(api_.Malloc(&p, bytes), "cudaMalloc of " + std::to_string(bytes)));
    return Allocation(this, p, bytes);
  }
  Result<uint64_t> copy_to_target(void* dst, const void* src, size_t n) override {
    return enqueue(dst, src, n, kMemcpyHostToDevice);
  }
  Result<uint64_t> copy_to_host(void* dst, const void* src, size_t n) override {
    return enqueue(dst, src, n, kMemcpyDeviceToHost);
  }
  Status wait(uint64_t ticket) override {
    cudaEvent_t e;
    {
      std::lock_guard lock(mu_);
      if (ticket == 0 || ticket + kEvents <= issued_) return ok();  // long since done
      e = events_[ticket % kEvents];
    }
    return check(api_.EventSynchronize(e), "cudaEventSynchronize");
  }
  bool done(uint64_t ticket) override {
    std::lock_guard lock(mu_);
    if (ticket == 0 || ticket + kEvents <= issued_) return true;
    return api_.EventQuery(events_[ticket % kEvents]) != kErrorNotReady;
  }

 protected:
  void release(void* ptr) override { api_.Free(ptr); }
  Result<AlignedBuffer> allocate_staging(size_t bytes) override {
    void* p = nullptr;
    SLUICE_RETURN_IF_ERROR(check(api_.HostAlloc(&p, bytes, 0), "cudaHostAlloc"));
    auto free_host = api_.FreeHost;
    return AlignedBuffer(p, bytes, [free_host](void* q) { free_host(q); });
  }

 private:
  Status check(cudaError_t rc, const std::string& what) const {
    if (rc == 0) return ok();
    return fail(Code::kIoError,
                what + " on cuda:" + std::to_string(device_) + ": " + api_.GetErrorString(rc));
  }

  Result<uint64_t> enqueue(void* dst, const void* src, size_t n, int kind) {
    std::lock_guard lock(mu_);
    uint64_t t = issued_ + 1;
    cudaEvent_t e = events_[t % kEvents];
    // A ticket reuses an event only once the copy kEvents earlier has finished.
    if (t > kEvents)
      SLUICE_RETURN_IF_ERROR(check(api_.EventSynchronize(e), "cudaEventSynchronize"));
    SLUICE_RETURN_IF_ERROR(check(api_.MemcpyAsync(dst, src, n, kind, stream_), "cudaMemcpyAsync"));
    SLUICE_RETURN_IF_ERROR(check(api_.EventRecord(e, stream_), "cudaEventRecord"));
    issued_ = t;
    return t;
  }

  CudaApi api_;
  int device_;
  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, kEvents> events_{};
  std::mutex mu_;
  uint64_t issued_ = 0;  // guarded by mu_
};

}  // namespace

Result<std::unique_ptr<Target>> open_cuda_target(const CudaOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(CudaApi api, load_cudart(options.library));
  int count = 0;
  int rc = api.GetDeviceCount(&count);
  if (rc != 0 || count == 0)
    return fail(Code::kUnsupported, std::string("no CUDA device: ") +
                                        (rc ? api.GetErrorString(rc) : "device count is 0"));
  if (options.device < 0 || options.device >= count)
    return fail(Code::kInvalidArgument, "CUDA device " + std::to_string(options.device) +
                                            " does not exist (" + std::to_string(count) +
                                            " present)");
  auto t = std::make_unique<CudaTarget>(api, options.device);
  SLUICE_RETURN_IF_ERROR(t->init());
  return std::unique_ptr<Target>(std::move(t));
}

}  // namespace sluice::mem

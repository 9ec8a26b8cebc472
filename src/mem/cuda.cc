// CUDA device memory through libcudart, loaded with dlopen at run time.
//
// The runtime's entry points come from shim/cudart.h (the CUDA headers are never needed
// to build). Copies go on one
// non-blocking stream; each copy records an event from a ring, and a ticket's completion
// is that event's.
#include <array>
#include <vector>

#include "shim/cudart.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/target.h"

namespace sluice::mem {
namespace {

using namespace shim;  // the CUDA runtime types and entry points

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

  std::string name() const override {
    return "cuda:" + std::to_string(device_) + " (" + api_.loaded + ")";
  }
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
      MutexLock lock(mu_);
      if (ticket == 0 || ticket + kEvents <= issued_) return ok();  // long since done
      e = events_[ticket % kEvents];
    }
    return check(api_.EventSynchronize(e), "cudaEventSynchronize");
  }
  bool done(uint64_t ticket) override {
    MutexLock lock(mu_);
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
    MutexLock lock(mu_);
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
  Mutex mu_;
  uint64_t issued_ SLUICE_GUARDED_BY(mu_) = 0;
};

}  // namespace

Result<std::unique_ptr<Target>> open_cuda_target(const CudaOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(CudaApi api, load_cudart(options.library));
  int count = 0;
  int rc = api.GetDeviceCount(&count);
  if (rc != 0 || count == 0)
    return fail(Code::kUnsupported, "no CUDA device (" + api.loaded + " loaded): " +
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

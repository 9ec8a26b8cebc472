// sluice/mem/target.h: where bytes land — host memory, or memory a copy engine must fill.
//
// Host memory is the default and always works: file I/O goes straight into it. A device
// target (CUDA device memory, or the emulated device used in tests) cannot be the target
// of a read(2); bytes reach it through ordered, asynchronous copies from staging buffers
// in (pinned) host memory, like cudaMemcpyAsync on one stream. The FileHandle drives that
// bounce pipeline; a Target only allocates, copies and reports completion.
//
// CUDA (libcudart) is loaded with dlopen at run time and never linked: on a machine
// without it, `open_cuda_target` fails with Unsupported and says which library it tried.
//
// Contract:
// - Copies enqueued on one Target complete in the order they were enqueued. A ticket is a
//   number that grows with each copy; `wait(t)` returns once copy t (and all before it)
//   are done; `done(t)` asks without blocking.
// - Enqueue, wait and done may be called from several threads; the Target serialises them.
// - Device addresses are opaque: only a Target's own copy calls may touch them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/mem/buffer_pool.h"

namespace sluice::mem {

enum class MemoryKind { kHost, kDevice };

class Target;

// A block of target memory, freed when destroyed. Move-only.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Target* target, void* ptr, size_t size) : target_(target), ptr_(ptr), size_(size) {}
  Allocation(Allocation&& o) noexcept;
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation();

  void* get() const { return ptr_; }
  size_t size() const { return size_; }
  Target* target() const { return target_; }

 private:
  Target* target_ = nullptr;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class Target {
 public:
  virtual ~Target() = default;

  // "host", "emulated-device", "cuda:0".
  virtual std::string name() const = 0;
  virtual MemoryKind kind() const = 0;

  virtual Result<Allocation> allocate(size_t bytes) = 0;
  // Enqueue copies between target memory and host memory. Return the copy's ticket.
  virtual Result<uint64_t> copy_to_target(void* dst, const void* host_src, size_t n) = 0;
  virtual Result<uint64_t> copy_to_host(void* host_dst, const void* src, size_t n) = 0;
  virtual Status wait(uint64_t ticket) = 0;
  virtual bool done(uint64_t ticket) = 0;

  // Staging (bounce) buffers of `size` bytes that this target copies from fastest:
  // page-locked host memory for CUDA. One pool per buffer size, created on first use and
  // kept for the target's lifetime, so buffers leased from one pool stay valid while
  // another size is asked for.
  BufferPool& staging(size_t buffer_size);

 protected:
  friend class Allocation;
  virtual void release(void* ptr) = 0;
  virtual Result<AlignedBuffer> allocate_staging(size_t bytes);

 private:
  Mutex staging_mu_;
  // Staging pools by buffer size.
  std::map<size_t, std::unique_ptr<BufferPool>> staging_ SLUICE_GUARDED_BY(staging_mu_);
};

// Ordinary host memory; copies are memcpy and complete at once.
std::unique_ptr<Target> make_host_target();

// A stand-in for a GPU, for tests and `sluice bench --mode bounce`: its memory lives in a
// private arena behind addresses that fault if dereferenced, so nothing but its copy
// calls can fill it, and a copy thread executes copies asynchronously in order, like a
// DMA engine on a CUDA stream.
std::unique_ptr<Target> make_emulated_device(size_t capacity_bytes);

struct CudaOptions {
  int device = 0;
  // libcudart to dlopen; empty tries libcudart.so, then .so.13, .so.12 and .so.11.0.
  std::string library;
};

// CUDA device memory through libcudart loaded at run time. Unsupported when the library or
// a device is missing, with the reason.
Result<std::unique_ptr<Target>> open_cuda_target(const CudaOptions& options = {});

}  // namespace sluice::mem

// sluice/mem/buffer_pool.h: aligned, reusable I/O buffers.
//
// O_DIRECT needs buffers aligned to the device's block size, and freshly allocated memory
// is slow to touch the first time (about 2 GiB/s on our machines), so sluice allocates
// staging buffers once and recycles them. Buffers of 2 MiB or more are 2 MiB-aligned and
// asked to be backed by transparent huge pages (MADV_HUGEPAGE; a no-op where the system
// setting is "never"). A BufferPool hands out move-only PooledBuffers
// that return themselves to the pool when destroyed.
//
// Thread safety: every call, and the release of a buffer, may run concurrently from any
// thread. The pool must outlive every buffer it handed out.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {

inline constexpr size_t kDirectAlignment = 4096;

// Owns `size` bytes at an address aligned to `alignment`, freed with the given function.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `huge_pages`: from 2 MiB, 2 MiB-aligned and asked to be backed by transparent huge
  // pages (fewer faults and fewer pages for O_DIRECT to pin, once touched; but on VMs whose
  // host backs memory lazily the first touch costs several times more).
  static Result<AlignedBuffer> allocate(size_t size, size_t alignment = kDirectAlignment,
                                        bool huge_pages = true);
  AlignedBuffer(void* data, size_t size, std::function<void(void*)> free_fn)
      : data_(data), size_(size), free_(std::move(free_fn)) {}
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  size_t size() const { return size_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Gives up ownership: the caller must free the memory with std::free.
  void* release() {
    free_ = nullptr;
    size_ = 0;
    return std::exchange(data_, nullptr);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::function<void(void*)> free_;
};

class BufferPool;

class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(BufferPool* pool, AlignedBuffer buf) : pool_(pool), buf_(std::move(buf)) {}
  PooledBuffer(PooledBuffer&& o) noexcept = default;
  PooledBuffer& operator=(PooledBuffer&& o) noexcept;
  ~PooledBuffer();

  std::byte* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }
  explicit operator bool() const { return static_cast<bool>(buf_); }

 private:
  void release();
  BufferPool* pool_ = nullptr;
  AlignedBuffer buf_;
};

class BufferPool {
 public:
  using Allocator = std::function<Result<AlignedBuffer>(size_t)>;
  // Buffers of `buffer_size` bytes; at most `max_idle` are kept for reuse. The default
  // allocator gives page-aligned host memory.
  explicit BufferPool(size_t buffer_size, size_t max_idle = 64, Allocator allocator = {});
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer from the idle list, or a new one. Fails only if allocation fails.
  Result<PooledBuffer> acquire();
  // Allocates new buffers, touches every page, and adds each to the idle list as it is
  // ready (where a concurrent acquire takes it), until the pool's buffers (idle and handed
  // out, counting those acquire allocated meanwhile) number `count`, or the idle list is
  // full, or `stop` is set. Returns how many it added; an allocation that fails is an error
  // naming how many were added before it.
  Result<size_t> reserve(size_t count, const std::atomic<bool>& stop);
  // Frees idle buffers beyond `keep_idle` worth `bytes` (carried over between calls in
  // whole buffers): memory the caller took elsewhere gives back as much of a reserve.
  void shed(size_t bytes, size_t keep_idle);
  size_t buffer_size() const { return buffer_size_; }
  size_t idle() const;

 private:
  friend class PooledBuffer;
  void give_back(AlignedBuffer buf);

  const size_t buffer_size_;
  const size_t max_idle_;
  Allocator allocator_;
  mutable Mutex mu_;
  std::vector<AlignedBuffer> idle_ SLUICE_GUARDED_BY(mu_);
  size_t live_ SLUICE_GUARDED_BY(mu_) = 0;        // buffers idle or handed out
  size_t shed_bytes_ SLUICE_GUARDED_BY(mu_) = 0;  // owed by shed, less than a buffer
};

// Buffers of any size, recycled: one whose last reference goes comes back here (up to
// `max_idle_bytes` in all, the rest freed) and is handed out again for a request it fits
// without wasting more than half of it. For memory that callers share and drop in any
// order, such as a loader's slices, whose samples a consumer keeps as long as it likes:
// a fresh allocation is zeroed by the kernel on first touch, which cost a warm epoch 80% of
// its CPU (docs/performance.md, "The warm path's CPU").
//
// Thread safety: every call, and the release of a buffer, from any thread. Buffers may
// outlive the recycler (they are then freed).
class BufferRecycler : public std::enable_shared_from_this<BufferRecycler> {
 public:
  static std::shared_ptr<BufferRecycler> create(size_t max_idle_bytes);
  BufferRecycler(const BufferRecycler&) = delete;
  BufferRecycler& operator=(const BufferRecycler&) = delete;

  // A buffer of at least `size` bytes, aligned for O_DIRECT, of small pages (buffer_pool.cc says
  // why). Fails only if allocation fails.
  Result<std::shared_ptr<AlignedBuffer>> acquire(size_t size);

  size_t idle_bytes() const;
  uint64_t reused() const { return reused_.load(std::memory_order_relaxed); }
  uint64_t allocated() const { return allocated_.load(std::memory_order_relaxed); }

 private:
  explicit BufferRecycler(size_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  void give_back(AlignedBuffer buf);

  const size_t max_idle_bytes_;
  mutable Mutex mu_;
  std::vector<AlignedBuffer> idle_ SLUICE_GUARDED_BY(mu_);
  size_t idle_bytes_ SLUICE_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> reused_{0}, allocated_{0};  // relaxed: statistics, only reported
};

}  // namespace sluice

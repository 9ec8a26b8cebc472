// Host target, the emulated device, and what every target shares.
#include <sys/mman.h>

#include <cstring>
#include <deque>
#include <map>
#include <thread>

#include "sluice/core/thread_annotations.h"
#include "sluice/mem/target.h"

namespace sluice::mem {

Allocation::Allocation(Allocation&& o) noexcept
    : target_(std::exchange(o.target_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    if (target_ && ptr_) target_->release(ptr_);
    target_ = std::exchange(o.target_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Allocation::~Allocation() {
  if (target_ && ptr_) target_->release(ptr_);
}

BufferPool& Target::staging(size_t buffer_size) {
  MutexLock lock(staging_mu_);
  auto& pool = staging_[buffer_size];
  if (!pool)
    pool = std::make_unique<BufferPool>(buffer_size, 64,
                                        [this](size_t n) { return allocate_staging(n); });
  return *pool;
}

Result<AlignedBuffer> Target::allocate_staging(size_t bytes) {
  return AlignedBuffer::allocate(bytes);
}

namespace {

class HostTarget final : public Target {
 public:
  std::string name() const override { return "host"; }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  Result<Allocation> allocate(size_t bytes) override {
    SLUICE_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::allocate(bytes));
    // Ownership moves into the Allocation; release() frees it.
    return Allocation(this, b.release(), bytes);
  }
  Result<uint64_t> copy_to_target(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return uint64_t{0};
  }
  Result<uint64_t> copy_to_host(void* dst, const void* src, size_t n) override {
    std::memcpy(dst, src, n);
    return uint64_t{0};
  }
  Status wait(uint64_t) override { return ok(); }
  bool done(uint64_t) override { return true; }

 protected:
  void release(void* ptr) override { std::free(ptr); }
};

// Non-canonical on x86-64 and unmapped on arm64: any direct access faults, and a read(2)
// into it fails with EFAULT, which is exactly what device memory would do.
constexpr uintptr_t kFakeBase = 0x4000'0000'0000'0000ULL;

class EmulatedDevice final : public Target {
 public:
  explicit EmulatedDevice(size_t capacity) : capacity_(capacity) {
    void* p = ::mmap(nullptr, capacity_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    arena_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
    copier_ = std::thread([this] { run(); });
  }
  ~EmulatedDevice() override {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    copier_.join();
    if (arena_) ::munmap(arena_, capacity_);
  }

  std::string name() const override { return "emulated-device"; }
  MemoryKind kind() const override { return MemoryKind::kDevice; }

  Result<Allocation> allocate(size_t bytes) override {
    if (!arena_) return fail(Code::kNoSpace, "emulated device arena could not be mapped");
    if (bytes == 0) return fail(Code::kInvalidArgument, "device allocation of 0 bytes");
    size_t need = round(bytes);
    MutexLock lock(mu_);
    uint64_t at = 0;
    for (auto& [off, len] : allocs_) {
      if (off - at >= need) break;
      at = off + round(len);
    }
    if (at + need > capacity_)
      return fail(Code::kNoSpace, "emulated device out of memory: " + std::to_string(bytes) +
                                      " bytes asked, capacity " + std::to_string(capacity_));
    allocs_[at] = bytes;
    return Allocation(this, reinterpret_cast<void*>(kFakeBase + at), bytes);
  }

  Result<uint64_t> copy_to_target(void* dst, const void* src, size_t n) override {
    SLUICE_ASSIGN_OR_RETURN(std::byte * real, translate(dst, n));
    return enqueue(real, src, n);
  }
  Result<uint64_t> copy_to_host(void* dst, const void* src, size_t n) override {
    SLUICE_ASSIGN_OR_RETURN(std::byte * real, translate(src, n));
    return enqueue(dst, real, n);
  }
  Status wait(uint64_t ticket) override {
    UniqueLock lock(mu_);
    cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return completed_ >= ticket; });
    return ok();
  }
  bool done(uint64_t ticket) override {
    MutexLock lock(mu_);
    return completed_ >= ticket;
  }

 protected:
  void release(void* ptr) override {
    MutexLock lock(mu_);
    allocs_.erase(reinterpret_cast<uintptr_t>(ptr) - kFakeBase);
  }

 private:
  // Allocations start on 256-byte boundaries, as cudaMalloc's do.
  static size_t round(size_t n) { return (n + 255) / 256 * 256; }

  struct Copy {
    void* dst;
    const void* src;
    size_t n;
    uint64_t ticket;
  };

  Result<std::byte*> translate(const void* dev, size_t n) {
    uintptr_t a = reinterpret_cast<uintptr_t>(dev);
    MutexLock lock(mu_);
    if (a >= kFakeBase) {
      uint64_t off = a - kFakeBase;
      auto it = allocs_.upper_bound(off);
      if (it != allocs_.begin()) {
        --it;
        if (off + n <= it->first + it->second) return arena_ + off;
      }
    }
    return fail(Code::kInvalidArgument, "address " + std::to_string(a) + " (+" + std::to_string(n) +
                                            " bytes) is not emulated-device memory");
  }

  Result<uint64_t> enqueue(void* dst, const void* src, size_t n) {
    MutexLock lock(mu_);
    uint64_t t = ++issued_;
    queue_.push_back(Copy{dst, src, n, t});
    cv_.notify_all();
    return t;
  }

  void run() {
    UniqueLock lock(mu_);
    while (true) {
      cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Copy c = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::memcpy(c.dst, c.src, c.n);
      lock.lock();
      completed_ = c.ticket;
      cv_.notify_all();
    }
  }

  const size_t capacity_;
  std::byte* arena_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  std::map<uint64_t, size_t> allocs_ SLUICE_GUARDED_BY(mu_);  // offset -> length asked for
  std::deque<Copy> queue_ SLUICE_GUARDED_BY(mu_);
  uint64_t issued_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t completed_ SLUICE_GUARDED_BY(mu_) = 0;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::thread copier_;
};

}  // namespace

std::unique_ptr<Target> make_host_target() {
  return std::make_unique<HostTarget>();
}

std::unique_ptr<Target> make_emulated_device(size_t capacity_bytes) {
  return std::make_unique<EmulatedDevice>(capacity_bytes);
}

}  // namespace sluice::mem

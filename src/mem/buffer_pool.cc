#include "sluice/mem/buffer_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

namespace sluice {

namespace {
constexpr size_t kHugePage = 2 << 20;
}  // namespace

Result<AlignedBuffer> AlignedBuffer::allocate(size_t size, size_t alignment, bool huge_pages) {
  if (size == 0) return fail(Code::kInvalidArgument, "aligned buffer of 0 bytes");
  // Large buffers are backed by transparent huge pages where the system allows them
  // (madvise or always): one fault and one page-table entry per 2 MiB instead of 512, and
  // O_DIRECT pins 2 pages per 4 MiB read instead of 1,024. On these VMs, where the first
  // touch of memory is slow, a warm read through sluiced went from 0.27 to 0.17 s a GiB.
  const bool huge = huge_pages && size >= kHugePage;
  if (huge) alignment = std::max(alignment, kHugePage);
  // The size is rounded to 4 KiB only, and only its whole 2 MiB pages are marked: a 3 MiB
  // buffer does not become 4 MiB of memory once touched.
  const size_t unit = huge ? kDirectAlignment : alignment;
  size_t rounded = (size + unit - 1) / unit * unit;
  void* p = nullptr;
  int rc = ::posix_memalign(&p, alignment, rounded);
  if (rc != 0)
    return fail_errno(rc, "allocate " + std::to_string(rounded) + "-byte aligned buffer");
  if (huge) (void)::madvise(p, rounded & ~(kHugePage - 1), MADV_HUGEPAGE);
  return AlignedBuffer(p, size, [](void* q) { std::free(q); });
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      free_(std::move(o.free_)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ && free_) free_(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    free_ = std::move(o.free_);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() {
  if (data_ && free_) free_(data_);
}

PooledBuffer& PooledBuffer::operator=(PooledBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::exchange(o.pool_, nullptr);
    buf_ = std::move(o.buf_);
  }
  return *this;
}

PooledBuffer::~PooledBuffer() {
  release();
}

void PooledBuffer::release() {
  if (pool_ && buf_) pool_->give_back(std::move(buf_));
  pool_ = nullptr;
}

BufferPool::BufferPool(size_t buffer_size, size_t max_idle, Allocator allocator)
    : buffer_size_(buffer_size), max_idle_(max_idle), allocator_(std::move(allocator)) {
  if (!allocator_) allocator_ = [](size_t n) { return AlignedBuffer::allocate(n); };
}

Result<PooledBuffer> BufferPool::acquire() {
  {
    MutexLock lock(mu_);
    if (!idle_.empty()) {
      AlignedBuffer b = std::move(idle_.back());
      idle_.pop_back();
      return PooledBuffer(this, std::move(b));
    }
    ++live_;  // counted before it exists, so a concurrent reserve stops in time
  }
  auto b = allocator_(buffer_size_);
  if (!b) {
    MutexLock lock(mu_);
    --live_;
    return std::unexpected(b.error());
  }
  return PooledBuffer(this, std::move(*b));
}

Result<size_t> BufferPool::reserve(size_t count, const std::atomic<bool>& stop) {
  size_t added = 0;
  // Relaxed: `stop` only cuts the work short; the buffers are published under mu_.
  while (!stop.load(std::memory_order_relaxed)) {
    {
      MutexLock lock(mu_);
      if (live_ >= count || idle_.size() >= max_idle_) break;
      ++live_;
    }
    auto b = allocator_(buffer_size_);
    if (!b) {
      MutexLock lock(mu_);
      --live_;
      return fail(b.error().code(), "after " + std::to_string(added) + " of " +
                                        std::to_string(count) + " buffers: " + b.error().message());
    }
    for (size_t at = 0; at < b->size(); at += 4096) b->data()[at] = std::byte{0};
    MutexLock lock(mu_);
    idle_.push_back(std::move(*b));
    ++added;
  }
  return added;
}

void BufferPool::shed(size_t bytes, size_t keep_idle) {
  std::vector<AlignedBuffer> freed;  // freed outside the lock
  MutexLock lock(mu_);
  if (idle_.size() <= keep_idle) {
    shed_bytes_ = 0;  // nothing beyond the floor: nothing owed
    return;
  }
  shed_bytes_ += bytes;
  while (shed_bytes_ >= buffer_size_ && idle_.size() > keep_idle) {
    freed.push_back(std::move(idle_.back()));
    idle_.pop_back();
    --live_;
    shed_bytes_ -= buffer_size_;
  }
}

size_t BufferPool::idle() const {
  MutexLock lock(mu_);
  return idle_.size();
}

void BufferPool::give_back(AlignedBuffer buf) {
  MutexLock lock(mu_);
  if (idle_.size() < max_idle_) {
    idle_.push_back(std::move(buf));
  } else {
    --live_;  // `buf` is freed as it goes out of scope, outside nothing but this lock
  }
}

std::shared_ptr<BufferRecycler> BufferRecycler::create(size_t max_idle_bytes) {
  return std::shared_ptr<BufferRecycler>(new BufferRecycler(max_idle_bytes));
}

Result<std::shared_ptr<AlignedBuffer>> BufferRecycler::acquire(size_t size) {
  size = std::max<size_t>(size, 1);
  AlignedBuffer got;
  {
    MutexLock lock(mu_);
    // The smallest idle buffer that fits, if it is no more than twice the size.
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i)
      if (idle_[i].size() >= size && idle_[i].size() / 2 <= size &&
          (best == idle_.size() || idle_[i].size() < idle_[best].size()))
        best = i;
    if (best < idle_.size()) {
      got = std::move(idle_[best]);
      idle_[best] = std::move(idle_.back());
      idle_.pop_back();
      idle_bytes_ -= got.size();
      reused_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!got) {
    // In 2 MiB units from 2 MiB (64 KiB below): sizes that differ a little share buffers.
    // Small pages: a loader's process touches its buffers once, and on these VMs the first
    // touch of huge pages cost 1.5-2 s of system time per 256 MiB where small pages cost
    // 0.4 s, for the same read speed (docs/performance.md, "The warm path's CPU").
    const size_t unit = size >= kHugePage ? kHugePage : size_t{64} << 10;
    SLUICE_ASSIGN_OR_RETURN(
        got, AlignedBuffer::allocate((size + unit - 1) / unit * unit, kDirectAlignment, false));
    allocated_.fetch_add(1, std::memory_order_relaxed);
  }
  std::weak_ptr<BufferRecycler> home = weak_from_this();
  return std::shared_ptr<AlignedBuffer>(new AlignedBuffer(std::move(got)),
                                        [home](AlignedBuffer* b) {
                                          if (auto r = home.lock()) r->give_back(std::move(*b));
                                          delete b;
                                        });
}

size_t BufferRecycler::idle_bytes() const {
  MutexLock lock(mu_);
  return idle_bytes_;
}

void BufferRecycler::give_back(AlignedBuffer buf) {
  MutexLock lock(mu_);
  if (idle_bytes_ + buf.size() > max_idle_bytes_) return;  // freed on the way out
  idle_bytes_ += buf.size();
  idle_.push_back(std::move(buf));
}

}  // namespace sluice

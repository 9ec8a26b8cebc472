// sluice/io/file_handle.h: the cuFile-shaped direct data path.
//
//   auto ctx = io::Context::open({}).value();                   // cuFileDriverOpen
//   auto fh = io::FileHandle::open(ctx, "/data/shard", {}).value();  // cuFileHandleRegister
//   fh.read(io::Buffer::host(p, n), n, file_offset);            // cuFileRead
//   auto f = fh.read_async(buf, n, off);                         // cuFileReadAsync
//   io::Batch batch = io::Batch::create(ctx, 64).value();        // cuFileBatchIOSetUp
//   batch.submit(ios); batch.wait(results, 1, timeout);          // Submit / GetStatus
//
// How bytes move:
// - O_DIRECT where the file system allows it (DirectMode::kAuto), opportunistically: the
//   unaligned head and tail of a request go through the page cache, the 4 KiB-aligned
//   middle goes direct, straight into the caller's memory when that is aligned too, else
//   through pooled aligned staging buffers. Any offset, length and buffer address gives
//   the right bytes.
// - Large requests are split into `chunk_size` pieces kept in flight together on an
//   io::Engine (io_uring, or the thread pool where io_uring is missing).
// - Device memory (mem::Target of kind kDevice) is filled through a ring of staging
//   buffers: file -> staging by the engine, staging -> device by the target's async copy,
//   so the next read overlaps the previous copy. With a CUDA target and compat mode OFF or
//   AUTO, GPUDirect Storage (cuFile) is used instead when libcufile loads.
// - Every handle reports the path it took and why (`path_report`).
//
// Contract:
// - A FileHandle may be used from many threads at once; each call leases its own engine.
// - A read returns the bytes read: fewer than asked only at end of file. A write returns
//   the size written or fails; a failed write may have written part of the range.
// - Errors name the file, the offset and the path (direct or buffered).
// - Handles and buffers must outlive the async operations and batch entries using them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/io/engine.h"
#include "sluice/mem/target.h"

namespace sluice::io {

// GPUDirect Storage, as in cuFile and kvikio: kOn = compatibility mode (never GDS, always
// POSIX I/O plus bounce copies), kOff = GDS required (Unsupported without it), kAuto = GDS
// when it loads, else POSIX.
enum class CompatMode { kAuto, kOn, kOff };
// O_DIRECT: kAuto = use it where the file system supports it, else buffered (with the
// reason); kOn = required (Unsupported without it); kOff = always buffered.
enum class DirectMode { kAuto, kOn, kOff };

struct ContextOptions {
  EngineOptions engine;          // backend and queue depth of each leased engine
  size_t chunk_size = 1 << 20;   // large requests split into pieces of this size
  unsigned staging_buffers = 8;  // staging buffers one transfer may hold at once
  unsigned async_threads = 2;    // threads running read_async / write_async
  std::string cufile_library;    // libcufile to dlopen; empty: the default names
};

class Context;

// A memory region to read into or write from: host memory (target null) or memory of a
// mem::Target. Not owning.
struct Buffer {
  void* ptr = nullptr;
  size_t size = 0;
  mem::Target* target = nullptr;  // null: host memory

  static Buffer host(void* p, size_t n) { return Buffer{p, n, nullptr}; }
  static Buffer host(const void* p, size_t n) { return Buffer{const_cast<void*>(p), n, nullptr}; }
  static Buffer on(const mem::Allocation& a) { return Buffer{a.get(), a.size(), a.target()}; }
};

struct OpenOptions {
  bool write = false;     // open read-write (else read-only)
  bool create = false;    // create if missing
  bool truncate = false;  // truncate to 0 on open
  mode_t mode = 0644;
  DirectMode direct = DirectMode::kAuto;
  CompatMode compat = CompatMode::kAuto;
};

// Which path a handle's I/O takes, and why.
struct PathReport {
  bool direct = false;  // O_DIRECT in use
  bool gds = false;     // cuFile registered
  std::string engine;   // "io_uring" or "thread-pool"
  std::string why;      // one sentence per decision
  // "direct+io_uring", "buffered+thread-pool", "gds", with "+bounce(<target>)" for a
  // device target that goes through staging buffers.
  std::string describe(const mem::Target* target = nullptr) const;
};

struct FileState;

class FileHandle {
 public:
  static Result<FileHandle> open(std::shared_ptr<Context> ctx, const std::string& path,
                                 const OpenOptions& options = {});
  FileHandle(FileHandle&&) noexcept;
  FileHandle& operator=(FileHandle&&) noexcept;
  ~FileHandle();

  // Reads `size` bytes at `file_offset` into `dst` at `buf_offset`.
  Result<size_t> read(const Buffer& dst, size_t size, uint64_t file_offset, size_t buf_offset = 0);
  Result<size_t> write(const Buffer& src, size_t size, uint64_t file_offset, size_t buf_offset = 0);
  std::future<Result<size_t>> read_async(const Buffer& dst, size_t size, uint64_t file_offset,
                                         size_t buf_offset = 0);
  std::future<Result<size_t>> write_async(const Buffer& src, size_t size, uint64_t file_offset,
                                          size_t buf_offset = 0);
  // Makes written bytes durable (fdatasync).
  Status sync();
  Result<uint64_t> size() const;

  PathReport path_report() const;
  const std::string& path() const;

 private:
  friend class Batch;
  friend class Transfer;
  FileHandle(std::shared_ptr<Context> ctx, std::unique_ptr<FileState> state);
  std::shared_ptr<Context> ctx_;
  std::unique_ptr<FileState> state_;
};

struct BatchIO {
  OpCode op = OpCode::kRead;  // kRead or kWrite
  FileHandle* file = nullptr;
  Buffer buf;
  size_t size = 0;
  uint64_t file_offset = 0;
  size_t buf_offset = 0;
  uint64_t cookie = 0;  // returned with the result
};

struct BatchResult {
  uint64_t cookie = 0;
  Result<size_t> result = size_t{0};
};

// Many independent I/Os in flight on one engine, as cuFile's batch API: submit, then reap
// results as they finish. Driven by one thread at a time.
class Batch {
 public:
  static Result<Batch> create(std::shared_ptr<Context> ctx, unsigned max_entries);
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  ~Batch();

  // Fails with InvalidArgument if more than `max_entries` would be in flight.
  Status submit(std::span<const BatchIO> ios);
  // Appends finished results to `out`: at least `min_complete` of them unless `timeout`
  // passes first. Returns how many were appended.
  Result<size_t> wait(std::vector<BatchResult>& out, size_t min_complete,
                      std::chrono::nanoseconds timeout);
  size_t in_flight() const;

 private:
  struct Impl;
  explicit Batch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Context : public std::enable_shared_from_this<Context> {
 public:
  static Result<std::shared_ptr<Context>> open(const ContextOptions& options = {});
  ~Context();

  const ContextOptions& options() const { return options_; }
  // The engine backend chosen, and why ("io_uring available", "... using thread pool").
  const std::string& engine_name() const { return engine_name_; }
  const std::string& engine_why() const { return engine_why_; }

  struct Internals;
  Internals& internals() { return *internals_; }

 private:
  Context() = default;
  ContextOptions options_;
  std::string engine_name_, engine_why_;
  std::unique_ptr<Internals> internals_;
};

}  // namespace sluice::io

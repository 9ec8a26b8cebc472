// sluice/io/engine.h: asynchronous file I/O shaped like io_uring.
//
// Prepare requests, submit them, wait for at least N completions with a timeout, reap.
// Two backends, chosen at run time by probing, never at build time:
//   - io_uring (liburing): the kernel does the work; one ring per Engine.
//   - thread pool: worker threads run pread/pwrite/fdatasync; works everywhere.
//
// Contract:
// - An Engine is owned and driven by one thread at a time (like a ring). Use one Engine
//   per thread for parallel submitters.
// - `submit` accepts at most `capacity() - in_flight()` requests; more is InvalidArgument.
//   Buffers must stay valid until their completion is reaped.
// - A completion's `result` is what the syscall returned: bytes transferred (possibly
//   short) or a negated errno. The engine never retries a short transfer; callers do.
// - Destroying an Engine waits for every request in flight.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "sluice/core/status.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::io {

enum class OpCode : uint8_t { kRead, kWrite, kFsync };

struct Request {
  OpCode op = OpCode::kRead;
  int fd = -1;
  void* buf = nullptr;  // for writes, read from; unused for fsync
  uint32_t len = 0;
  uint64_t offset = 0;
  uint64_t user_data = 0;  // returned in the completion
};

struct Completion {
  uint64_t user_data = 0;
  int64_t result = 0;  // bytes transferred, or -errno
};

enum class EngineKind { kAuto, kUring, kThreadPool };

struct EngineOptions {
  EngineKind kind = EngineKind::kAuto;
  unsigned queue_depth = 64;                // requests in flight at most
  unsigned threads = 4;                     // thread-pool backend: worker threads
  telemetry::Registry* registry = nullptr;  // records ops, bytes and latency if set
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual Status submit(std::span<const Request> requests) = 0;
  // Waits until at least `min_complete` completions are ready (or `timeout` passes), then
  // moves up to `out.size()` of them into `out` and returns how many. A timeout with
  // fewer than `min_complete` ready returns what is there (maybe 0), not an error.
  virtual Result<size_t> wait(std::span<Completion> out, size_t min_complete,
                              std::chrono::nanoseconds timeout) = 0;

  virtual unsigned capacity() const = 0;
  virtual unsigned in_flight() const = 0;
  virtual EngineKind kind() const = 0;
  // "io_uring" or "thread-pool".
  virtual std::string_view name() const = 0;
};

struct EngineChoice {
  std::unique_ptr<Engine> engine;
  std::string why;  // why this backend: "io_uring available", "io_uring_setup: ENOSYS ..."
};

// Makes the engine the options ask for. kAuto probes io_uring and falls back to the thread
// pool, saying why in `why`; kUring fails with Unsupported when io_uring is unavailable.
Result<EngineChoice> make_engine(const EngineOptions& options);

// Whether io_uring works in this process (cached after the first probe), and why not.
bool uring_available(std::string* why_not = nullptr);

std::string_view engine_kind_name(EngineKind kind);

}  // namespace sluice::io

// sluice/doctor/sweep.h: a path's ceiling, measured with the bench engine (sluice/io/bench.h)
// over block size x queue depth x engine, reading only (`sluice doctor --path`).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/core/status.h"
#include "sluice/doctor/diagnose.h"

namespace sluice::doctor {

struct SweepOptions {
  double budget = 20;         // seconds for the whole grid; a short one measures fewer points
  bool with_buffered = true;  // also the page cache from a cold start
  const std::atomic<bool>* cancel = nullptr;  // set: stops before the next point (kCancelled)
  // Called before each point: its index (from 1), the count, and the point.
  std::function<void(size_t index, size_t count, std::string_view engine, uint64_t bs, unsigned qd)>
      on_point;
};

// Measures `file` (a regular file or block device, only read) and returns its ceiling.
Result<Ceiling> sweep(const std::string& file, const SweepOptions& options);

// A scratch file of the doctor's own in a directory, to measure what holds it: created
// exclusively (never through a link: a name planted in a shared directory cannot make the
// lay-out write over someone else's file), laid out with the bench engine, its pages
// dropped, and removed when this goes. Scratch files of doctors that died first (their
// process is gone) are removed before.
struct ScratchOptions {
  uint64_t size = 0;  // 0: a quarter of the free space, at most 1 GiB (whole MiB, 16 MiB least)
  const std::atomic<bool>* cancel = nullptr;  // set: the lay-out stops (kCancelled)
  std::function<void(uint64_t done, uint64_t total)> on_lay_out;
};

class ScratchFile {
 public:
  // NoSpace when the directory has too little room; AlreadyExists when the name is taken
  // (that file is left alone).
  static Result<std::unique_ptr<ScratchFile>> create(const std::string& directory,
                                                     const ScratchOptions& options);
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

 private:
  ScratchFile(std::string path, uint64_t size) : path_(std::move(path)), size_(size) {}
  std::string path_;
  uint64_t size_ = 0;
};

// The GPU paths where CUDA loads: pinned and pageable host-to-device copy rates (best of
// three 256 MiB copies) and whether cuFile opens `file`; otherwise why not.
struct GpuProbe {
  bool found = false;
  std::string name, why;
  double pinned_h2d_bytes_s = 0, pageable_h2d_bytes_s = 0;
  std::optional<std::string> cufile;  // the path cuFile gives `file`, or why none

  std::string json() const;
  std::string text() const;
};
GpuProbe probe_gpu(const std::string& file);

}  // namespace sluice::doctor

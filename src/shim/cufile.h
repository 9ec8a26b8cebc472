// GPUDirect Storage through libcufile, loaded with dlopen at run time (never linked).
//
// Restates the few cuFile C types and entry points sluice uses, so the build never needs
// the cuFile headers. Internal to the data path.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "sluice/core/status.h"

namespace sluice::io {

class CuFileLibrary {
 public:
  // Loads libcufile and opens the driver once per process; Unsupported with the reason
  // when the library, the driver or the nvidia-fs module is missing.
  static Result<CuFileLibrary*> get(const std::string& library = {});

  Result<void*> register_fd(int fd, const std::string& path);
  void deregister(void* handle);
  // Returns bytes transferred or an error naming `path` and the offset.
  Result<size_t> read(void* handle, void* dev_base, size_t size, off_t file_offset,
                      off_t dev_offset, const std::string& path);
  Result<size_t> write(void* handle, const void* dev_base, size_t size, off_t file_offset,
                       off_t dev_offset, const std::string& path);

 private:
  CuFileLibrary() = default;
  struct Api;
  std::unique_ptr<Api> api_;
};

}  // namespace sluice::io

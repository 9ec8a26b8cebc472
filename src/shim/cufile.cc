#include "shim/cufile.h"

#include <dlfcn.h>

#include <cstring>
#include <vector>

#include "sluice/core/thread_annotations.h"

namespace sluice::io {
namespace {

// The cuFile ABI (cufile.h): an error is {cuFile op error, CUDA driver error}; a file is
// described by a handle type and a union holding the fd.
struct CUfileError {
  int err;
  int cu_err;
};
constexpr int kCuFileHandleTypeOpaqueFd = 1;
struct CUfileDescr {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

// Whether the CUDA driver sees a device. cuFileDriverOpen is only asked where one does: on
// a machine without a GPU it may never return (libcufile from PyPI, which every torch
// install brings into the process, spins in it), so its own error is never reached.
std::string cuda_device_missing() {
  void* cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cuda) return "no CUDA driver (libcuda.so.1 not found)";
  auto init = reinterpret_cast<int (*)(unsigned)>(::dlsym(cuda, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(::dlsym(cuda, "cuDeviceGetCount"));
  // The driver stays loaded: CUDA is process-wide state, and unloading it is not supported.
  if (!init || !count) return "the CUDA driver lacks cuInit/cuDeviceGetCount";
  if (int e = init(0); e != 0)
    return "no CUDA device (cuInit: CUDA error " + std::to_string(e) + ")";
  int n = 0;
  if (int e = count(&n); e != 0 || n == 0) return "no CUDA device";
  return {};
}

}  // namespace

struct CuFileLibrary::Api {
  void* lib = nullptr;
  CUfileError (*DriverOpen)() = nullptr;
  CUfileError (*HandleRegister)(void**, CUfileDescr*) = nullptr;
  void (*HandleDeregister)(void*) = nullptr;
  ssize_t (*Read)(void*, void*, size_t, off_t, off_t) = nullptr;
  ssize_t (*Write)(void*, const void*, size_t, off_t, off_t) = nullptr;
};

Result<CuFileLibrary*> CuFileLibrary::get(const std::string& library) {
  // One driver per process, as cuFile requires; the result (or the reason it failed) is
  // kept for the life of the process.
  static Mutex mu;
  static std::unique_ptr<CuFileLibrary> instance SLUICE_GUARDED_BY(mu);
  static std::string failure SLUICE_GUARDED_BY(mu);
  MutexLock lock(mu);
  if (instance) return instance.get();
  if (!failure.empty()) return fail(Code::kUnsupported, failure);
  if (std::string why = cuda_device_missing(); !why.empty()) {
    failure = why;
    return fail(Code::kUnsupported, failure);
  }
  auto api = std::make_unique<Api>();
  std::string tried;
  std::vector<std::string> names = {"libcufile.so.0", "libcufile.so"};
  if (!library.empty()) names = {library};
  for (const std::string& n : names) {
    api->lib = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api->lib) break;
    const char* e = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(e ? e : n);
  }
  if (!api->lib) {
    failure = "GPUDirect Storage library not found (" + tried + ")";
    return fail(Code::kUnsupported, failure);
  }
  api->DriverOpen =
      reinterpret_cast<decltype(api->DriverOpen)>(::dlsym(api->lib, "cuFileDriverOpen"));
  api->HandleRegister =
      reinterpret_cast<decltype(api->HandleRegister)>(::dlsym(api->lib, "cuFileHandleRegister"));
  api->HandleDeregister = reinterpret_cast<decltype(api->HandleDeregister)>(
      ::dlsym(api->lib, "cuFileHandleDeregister"));
  api->Read = reinterpret_cast<decltype(api->Read)>(::dlsym(api->lib, "cuFileRead"));
  api->Write = reinterpret_cast<decltype(api->Write)>(::dlsym(api->lib, "cuFileWrite"));
  if (!api->DriverOpen || !api->HandleRegister || !api->HandleDeregister || !api->Read ||
      !api->Write) {
    failure = "libcufile lacks a needed entry point (cuFileDriverOpen/HandleRegister/Read/Write)";
    return fail(Code::kUnsupported, failure);
  }
  CUfileError e = api->DriverOpen();
  if (e.err != 0) {
    failure = "cuFileDriverOpen failed: cuFile error " + std::to_string(e.err) + ", CUDA error " +
              std::to_string(e.cu_err);
    return fail(Code::kUnsupported, failure);
  }
  instance.reset(new CuFileLibrary());
  instance->api_ = std::move(api);
  return instance.get();
}

Result<void*> CuFileLibrary::register_fd(int fd, const std::string& path) {
  CUfileDescr d;
  std::memset(&d, 0, sizeof d);
  d.type = kCuFileHandleTypeOpaqueFd;
  d.handle.fd = fd;
  void* h = nullptr;
  CUfileError e = api_->HandleRegister(&h, &d);
  if (e.err != 0)
    return fail(Code::kUnsupported,
                "cuFileHandleRegister " + path + ": cuFile error " + std::to_string(e.err));
  return h;
}

void CuFileLibrary::deregister(void* handle) {
  api_->HandleDeregister(handle);
}

static Result<size_t> cufile_result(ssize_t n, const char* op, size_t size, off_t off,
                                    const std::string& path) {
  if (n >= 0) return static_cast<size_t>(n);
  std::string what = std::string(op) + " " + std::to_string(size) + " bytes at offset " +
                     std::to_string(off) + " of " + path;
  if (n == -1) return fail_errno(errno, what);
  // Negative values other than -1 are cuFile error codes (or -errno below 5000).
  if (-n < 5000) return fail_errno(static_cast<int>(-n), what);
  return fail(Code::kIoError, what + ": cuFile error " + std::to_string(-n));
}

Result<size_t> CuFileLibrary::read(void* handle, void* dev_base, size_t size, off_t file_offset,
                                   off_t dev_offset, const std::string& path) {
  return cufile_result(api_->Read(handle, dev_base, size, file_offset, dev_offset), "cuFileRead",
                       size, file_offset, path);
}

Result<size_t> CuFileLibrary::write(void* handle, const void* dev_base, size_t size,
                                    off_t file_offset, off_t dev_offset, const std::string& path) {
  return cufile_result(api_->Write(handle, dev_base, size, file_offset, dev_offset), "cuFileWrite",
                       size, file_offset, path);
}

}  // namespace sluice::io

// The Python module's compiled core (sluice._core): shared pieces of its source files.
// Everything that touches torch or fsspec is plain Python (python/sluice/); this part speaks
// only the buffer protocol, so no torch version touches the compiled ABI.
#pragma once

#include <pybind11/pybind11.h>
#include <unistd.h>

#include <cstddef>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include "sluice/client/session.h"
#include "sluice/core/status.h"

namespace sluice::python {

namespace py = pybind11;

// A sluice Error on its way to Python: the translator (errors.cc) raises the exception
// class registered for its code, with the same message the CLI prints.
class StatusError : public std::exception {
 public:
  explicit StatusError(Error e) : error_(std::move(e)), what_(error_.message()) {}
  const Error& error() const { return error_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Error error_;
  std::string what_;
};

[[noreturn]] inline void raise(const Error& e) {
  throw StatusError(e);
}
[[noreturn]] inline void raise(Code code, std::string message) {
  throw StatusError(Error(code, std::move(message)));
}
inline void check(const Status& s) {
  if (!s) raise(s.error());
}
template <class T>
T unwrap(Result<T>&& r) {
  if (!r) raise(r.error());
  return std::move(*r);
}

// Runs `f` with the GIL released (a blocking call: other Python threads go on meanwhile) and
// returns what it returns.
template <class F>
auto without_gil(F&& f) {
  py::gil_scoped_release unlocked;
  return f();
}

// Objects holding threads (a checkpointer, a loader, a cache) made before a fork(): in the
// child their threads are gone, so destroying them there would wait forever (a DataLoader
// worker collecting an inherited checkpointer), and a writer's abort would remove the
// parent's temporary file. A child leaks them instead; the owner destroys them with the
// GIL released.
template <class P>
void drop_owned(P& p, pid_t owner) {
  if (!p) return;
  if (::getpid() != owner) {
    new P(std::move(p));  // leaked on purpose: never destroyed in this process
    return;
  }
  without_gil([&] { p.reset(); });
}

// Memory named by its address: what the package's own Python builds from a torch tensor's
// data_ptr() (or a __cuda_array_interface__) while it holds the tensor, as
// sluice._core._RawSpan. Never built from what a caller passed: a public call takes the
// buffer protocol and tensors only, so no caller can name arbitrary process memory (a
// plain (address, nbytes) tuple is refused as not a buffer).
struct RawSpan {
  uintptr_t address = 0;
  size_t nbytes = 0;
  int cuda_device = -1;  // -1: host memory; else the CUDA device it is on
};

// Memory a Python object lends for the length of one call: anything with the buffer
// protocol (bytearray, memoryview, numpy arrays, mmap), C-contiguous; or a host RawSpan.
// Construct and destroy with the GIL held; use the span without it.
class Borrowed {
 public:
  Borrowed(py::handle obj, bool writable, const std::string& what);
  ~Borrowed();
  Borrowed(const Borrowed&) = delete;
  Borrowed& operator=(const Borrowed&) = delete;
  std::span<std::byte> bytes() const { return {data_, size_}; }
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Py_buffer view_{};
  bool has_view_ = false;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

void bind_errors(py::module_& m);
void bind_objects(py::module_& m);
void bind_data(py::module_& m);
void bind_ckpt(py::module_& m);
void bind_io(py::module_& m);
// The client::Session behind a sluice._core.Session.
client::Session& session_of(py::handle h);

}  // namespace sluice::python

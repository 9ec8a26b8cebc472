// Errors: one Python class per sluice error code, registered by python/sluice/errors.py.
#include <mutex>
#include <unordered_map>

#include "core.h"

namespace sluice::python {

namespace {

// code name ("not_found") -> the Python class; set once at import.
py::dict& classes() {
  static py::dict* d = new py::dict();  // never destroyed: it outlives the interpreter's exit
  return *d;
}

}  // namespace

void bind_errors(py::module_& m) {
  // Private to the package (python/sluice/_buffers.py): see RawSpan in core.h.
  py::class_<RawSpan>(m, "_RawSpan")
      .def(py::init([](uintptr_t address, size_t nbytes, int cuda_device) {
             return RawSpan{address, nbytes, cuda_device};
           }),
           py::arg("address"), py::arg("nbytes"), py::arg("cuda_device") = -1)
      .def_readonly("address", &RawSpan::address)
      .def_readonly("nbytes", &RawSpan::nbytes)
      .def_readonly("cuda_device", &RawSpan::cuda_device);
  m.def(
      "_set_error_classes", [](py::dict d) { classes() = std::move(d); },
      "Sets the exception class raised for each error code (python/sluice/errors.py).");
  m.def("_raise", [](const std::string& code, const std::string& message) {
    for (int c = 1; c <= static_cast<int>(Code::kInternal); ++c)
      if (code_name(static_cast<Code>(c)) == code) raise(static_cast<Code>(c), message);
    raise(Code::kInvalidArgument, "no error code '" + code + "'");
  });
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      std::string name(code_name(e.error().code()));
      py::object cls = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
      if (classes().contains(name)) cls = classes()[py::str(name)];
      py::object exc = cls(e.error().message());
      try {
        exc.attr("code") = name;
      } catch (const py::error_already_set&) {
      }
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

Borrowed::Borrowed(py::handle obj, bool writable, const std::string& what) {
  if (py::isinstance<RawSpan>(obj)) {
    const auto& raw = obj.cast<const RawSpan&>();
    if (raw.cuda_device >= 0)
      raise(Code::kInvalidArgument, what + ": device memory is not host memory");
    if (raw.address == 0 && raw.nbytes != 0)
      raise(Code::kInvalidArgument, what + ": a raw span at address 0");
    data_ = reinterpret_cast<std::byte*>(raw.address);
    size_ = raw.nbytes;
    return;
  }
  int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
    // Why, in the module's words (the interpreter's BufferError says little).
    PyErr_Clear();
    std::string type = py::str(py::type::handle_of(obj).attr("__name__"));
    Py_buffer probe{};
    if (PyObject_GetBuffer(obj.ptr(), &probe, PyBUF_FULL_RO) != 0) {
      PyErr_Clear();
      raise(Code::kInvalidArgument,
            what + ": a " + type +
                " is not a buffer (give a bytearray, memoryview, numpy array or torch tensor)");
    }
    bool read_only = probe.readonly;
    PyBuffer_Release(&probe);
    if (writable && read_only)
      raise(Code::kInvalidArgument,
            what + ": the " + type + " is read-only (bytes cannot be filled)");
    raise(Code::kInvalidArgument,
          what + ": the " + type + " is not C-contiguous (its bytes are not one range)");
  }
  has_view_ = true;
  data_ = static_cast<std::byte*>(view_.buf);
  size_ = static_cast<size_t>(view_.len);
}

Borrowed::~Borrowed() {
  if (has_view_) PyBuffer_Release(&view_);
}

}  // namespace sluice::python

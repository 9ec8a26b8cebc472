// sluice.io's compiled half: io::FileHandle shaped like KvikIO's CuFile (pread/pwrite
// futures, blocking read/write), a batch call, and which path the bytes take.
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "core.h"
#include "sluice/io/file_handle.h"
#include "sluice/mem/target.h"

namespace sluice::python {

namespace {

// The CUDA targets opened so far, one per device, for the life of the process.
mem::Target* cuda_target(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<mem::Target>> targets;
  std::lock_guard lock(mu);
  auto& t = targets[device];
  if (!t) t = unwrap(mem::open_cuda_target({.device = device}));
  return t.get();
}

// Memory for one I/O: a buffer or host RawSpan (Borrowed), or a RawSpan on a CUDA device.
struct IoMemory {
  std::unique_ptr<Borrowed> host;
  io::Buffer buf;
};

IoMemory io_memory(py::handle obj, bool writable, const std::string& what) {
  IoMemory m;
  if (py::isinstance<RawSpan>(obj) && obj.cast<const RawSpan&>().cuda_device >= 0) {
    const auto& raw = obj.cast<const RawSpan&>();
    m.buf =
        io::Buffer{reinterpret_cast<void*>(raw.address), raw.nbytes, cuda_target(raw.cuda_device)};
    return m;
  }
  m.host = std::make_unique<Borrowed>(obj, writable, what);
  m.buf = io::Buffer::host(m.host->data(), m.host->size());
  return m;
}

size_t io_size(const IoMemory& m, py::object size, size_t buf_offset, const std::string& what) {
  if (buf_offset > m.buf.size)
    raise(Code::kInvalidArgument, what + ": buf_offset " + std::to_string(buf_offset) +
                                      " is past the buffer's " + std::to_string(m.buf.size) +
                                      " bytes");
  size_t room = m.buf.size - buf_offset;
  if (size.is_none()) return room;
  auto n = size.cast<size_t>();
  if (n > room)
    raise(Code::kInvalidArgument, what + ": " + std::to_string(n) +
                                      " bytes do not fit the buffer's " + std::to_string(room) +
                                      " from buf_offset");
  return n;
}

// An I/O in flight: holds the memory it was lent, and the file, until it is done; dropping
// it waits for the I/O (its memory may be freed right after).
struct IoFuture {
  IoMemory memory;
  std::shared_ptr<io::FileHandle> file;
  std::future<Result<size_t>> f;
  std::optional<size_t> value;
  std::optional<Error> error;

  pid_t owner = ::getpid();
  ~IoFuture() {
    if (::getpid() != owner) {  // made before a fork: its I/O is not in this process
      new std::future<Result<size_t>>(std::move(f));
      drop_owned(file, owner);
      return;
    }
    if (f.valid()) without_gil([&] { f.wait(); });
  }
  size_t get() {
    if (!value && !error) {
      auto r = without_gil([&] { return f.get(); });
      if (r)
        value = *r;
      else
        error = r.error();
    }
    if (error) raise(*error);
    return *value;
  }
  bool done() const {
    return value || error || f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
};

struct PyFile {
  std::string path;
  std::shared_ptr<io::Context> ctx;
  std::shared_ptr<io::FileHandle> fh;
  pid_t owner = ::getpid();
  ~PyFile() {
    drop_owned(fh, owner);
    drop_owned(ctx, owner);
  }

  // The handle for one call: a close() meanwhile leaves it open until the call (or the
  // future holding it) is done.
  std::shared_ptr<io::FileHandle> handle() const {
    auto h = fh;
    if (!h) raise(Code::kInvalidArgument, path + ": I/O on a closed sluice.io.File");
    return h;
  }

  // A blocking read (kWrite false) or write of `size` bytes (default: what fits) at
  // `file_offset`, into or from `buf` at `buf_offset`.
  template <bool kWrite>
  size_t now(py::handle buf, py::object size, uint64_t file_offset, size_t buf_offset) {
    const std::string what = (kWrite ? "write " : "read ") + path;
    IoMemory mem = io_memory(buf, !kWrite, what);
    size_t n = io_size(mem, size, buf_offset, what);
    auto h = handle();
    auto r = without_gil([&] {
      return kWrite ? h->write(mem.buf, n, file_offset, buf_offset)
                    : h->read(mem.buf, n, file_offset, buf_offset);
    });
    return unwrap(std::move(r));
  }

  // The same, started: a future holding the memory and the file until it is done.
  template <bool kWrite>
  std::unique_ptr<IoFuture> start(py::handle buf, py::object size, uint64_t file_offset,
                                  size_t buf_offset) {
    const std::string what = (kWrite ? "pwrite " : "pread ") + path;
    auto fut = std::make_unique<IoFuture>();
    fut->memory = io_memory(buf, !kWrite, what);
    size_t n = io_size(fut->memory, size, buf_offset, what);
    fut->file = handle();
    fut->f = kWrite ? fut->file->write_async(fut->memory.buf, n, file_offset, buf_offset)
                    : fut->file->read_async(fut->memory.buf, n, file_offset, buf_offset);
    return fut;
  }
};

py::dict report_dict(const io::PathReport& r, const mem::Target* target) {
  py::dict d;
  d["direct"] = r.direct;
  d["gds"] = r.gds;
  d["engine"] = r.engine;
  d["why"] = r.why;
  d["path"] = r.describe(target);
  return d;
}

}  // namespace

void bind_io(py::module_& m) {
  py::class_<IoFuture>(m, "IoFuture").def("get", &IoFuture::get).def("done", &IoFuture::done);

  py::class_<PyFile>(m, "File")
      .def(py::init([](const std::string& path, const std::string& flags, const std::string& direct,
                       const std::string& compat) {
             io::OpenOptions o;
             if (flags == "r") {
             } else if (flags == "r+") {
               o.write = true;
             } else if (flags == "w" || flags == "w+") {
               o.write = o.create = o.truncate = true;
             } else if (flags == "a") {
               o.write = o.create = true;
             } else {
               raise(Code::kInvalidArgument,
                     path + ": flags '" + flags + "' are not one of r, r+, w, w+ and a");
             }
             auto mode = [&](const std::string& v, const char* what) {
               if (v == "auto") return 0;
               if (v == "on") return 1;
               if (v == "off") return 2;
               raise(Code::kInvalidArgument,
                     std::string(what) + " '" + v + "' is not one of auto, on and off");
             };
             o.direct = static_cast<io::DirectMode>(mode(direct, "direct"));
             o.compat = static_cast<io::CompatMode>(mode(compat, "compat"));
             auto p = std::make_unique<PyFile>();
             p->path = path;
             auto opened = without_gil([&]() -> Result<io::FileHandle> {
               SLUICE_ASSIGN_OR_RETURN(p->ctx, io::Context::open());
               return io::FileHandle::open(p->ctx, path, o);
             });
             p->fh = std::make_shared<io::FileHandle>(unwrap(std::move(opened)));
             return p;
           }),
           py::arg("path"), py::arg("flags") = "r", py::arg("direct") = "auto",
           py::arg("compat") = "auto")
      .def("read", &PyFile::now<false>, py::arg("buf"), py::arg("size") = py::none(),
           py::arg("file_offset") = 0, py::arg("buf_offset") = 0)
      .def("write", &PyFile::now<true>, py::arg("buf"), py::arg("size") = py::none(),
           py::arg("file_offset") = 0, py::arg("buf_offset") = 0)
      .def("pread", &PyFile::start<false>, py::arg("buf"), py::arg("size") = py::none(),
           py::arg("file_offset") = 0, py::arg("buf_offset") = 0)
      .def("pwrite", &PyFile::start<true>, py::arg("buf"), py::arg("size") = py::none(),
           py::arg("file_offset") = 0, py::arg("buf_offset") = 0)
      .def(
          "batch",
          [](PyFile& f, const py::list& ios) {
            // (op, buf, size, file_offset): every I/O in flight at once on one engine.
            std::vector<IoMemory> mems;
            std::vector<io::BatchIO> batch;
            auto h = f.handle();
            for (size_t i = 0; i < ios.size(); ++i) {
              auto t = ios[i].cast<py::tuple>();
              if (t.size() != 4)
                raise(Code::kInvalidArgument, "batch: each I/O is (op, buf, size, file_offset)");
              auto op = t[0].cast<std::string>();
              if (op != "read" && op != "write")
                raise(Code::kInvalidArgument, "batch: op '" + op + "' is not read or write");
              mems.push_back(io_memory(t[1], op == "read", "batch " + f.path));
              size_t n = io_size(mems.back(), t[2], 0, "batch " + f.path);
              batch.push_back({.op = op == "read" ? io::OpCode::kRead : io::OpCode::kWrite,
                               .file = h.get(),
                               .buf = mems.back().buf,
                               .size = n,
                               .file_offset = t[3].cast<uint64_t>(),
                               .cookie = i});
            }
            auto results = without_gil([&]() -> Result<std::vector<Result<size_t>>> {
              SLUICE_ASSIGN_OR_RETURN(io::Batch b, io::Batch::create(f.ctx, batch.size()));
              SLUICE_RETURN_IF_ERROR(b.submit(batch));
              std::vector<io::BatchResult> out;
              while (out.size() < batch.size()) {
                SLUICE_ASSIGN_OR_RETURN(
                    size_t got, b.wait(out, batch.size() - out.size(), std::chrono::hours(1)));
                (void)got;
              }
              std::vector<Result<size_t>> in_order(batch.size());
              for (auto& r : out) in_order[r.cookie] = std::move(r.result);
              return in_order;
            });
            py::list out;
            for (auto& r : unwrap(std::move(results))) out.append(unwrap(std::move(r)));
            return out;
          },
          py::arg("ios"))
      .def("sync",
           [](PyFile& f) {
             auto h = f.handle();
             auto s = without_gil([&] { return h->sync(); });
             check(s);
           })
      .def_property_readonly("size",
                             [](PyFile& f) {
                               auto r = f.handle()->size();
                               return unwrap(std::move(r));
                             })
      .def("path_report", [](PyFile& f) { return report_dict(f.handle()->path_report(), nullptr); })
      .def("close", [](PyFile& f) { drop_owned(f.fh, f.owner); })
      .def_property_readonly("closed", [](const PyFile& f) { return !f.fh; });

  m.def("cuda_status", [](int device) {
    // Whether device memory can be a target here, and why not.
    auto t = without_gil([&] { return mem::open_cuda_target({.device = device}); });
    py::dict d;
    d["available"] = bool(t);
    d["name"] = t ? (*t)->name() : std::string();
    d["why"] = t ? std::string() : t.error().message();
    return d;
  });
}

}  // namespace sluice::python

// Sessions, objects, copies and listings: sluice.Session's compiled half.
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "core.h"
#include "sluice/client/copy.h"
#include "sluice/client/environment.h"
#include "sluice/client/ledger.h"
#include "sluice/client/object.h"
#include "sluice/client/session.h"
#include "sluice/core/sizes.h"

namespace sluice::python {

namespace {

uint64_t size_arg(const py::object& v, const char* name, uint64_t fallback) {
  if (v.is_none()) return fallback;
  if (py::isinstance<py::str>(v)) {
    auto n = parse_size(v.cast<std::string>());
    if (!n) raise(n.error().with_context(name));
    return *n;
  }
  auto n = v.cast<int64_t>();
  if (n < 0) raise(Code::kInvalidArgument, std::string(name) + ": a size below 0");
  return static_cast<uint64_t>(n);
}

py::dict info_dict(const store::ObjectInfo& i) {
  py::dict d;
  d["key"] = i.key;
  d["size"] = i.size;
  d["etag"] = i.etag;
  d["mtime_ns"] = i.mtime_ns;
  return d;
}

// One object opened for reading, pinned to the version stat saw: a change midway is
// Conflict, never a mix of two versions.
class Reader {
 public:
  Reader(client::ObjectRef ref, store::ObjectInfo info)
      : store_(std::move(ref.store)),
        key_(std::move(ref.key)),
        text_(std::move(ref.text)),
        info_(std::move(info)) {}

  size_t read_into(py::handle buffer, uint64_t offset) {
    Borrowed mem(buffer, true, "read_into " + text_);
    std::shared_ptr<store::Store> store = store_;  // a close() meanwhile leaves it to us
    if (!store) raise(Code::kInvalidArgument, text_ + ": read from a closed file");
    if (offset >= info_.size || mem.size() == 0) return 0;
    auto dst = mem.bytes().first(std::min<uint64_t>(mem.size(), info_.size - offset));
    auto n = without_gil([&] {
      return store->read_full(key_, offset, dst,
                              {.if_match = info_.etag, .object_size = info_.size});
    });
    if (!n) raise(n.error().with_context(text_));
    if (*n != dst.size())
      raise(Code::kCorruption, text_ + ": the object ended at byte " + std::to_string(offset + *n) +
                                   ", before its size " + std::to_string(info_.size));
    return *n;
  }
  ~Reader() { drop_owned(store_, owner_); }
  const store::ObjectInfo& info() const { return info_; }
  void close() {
    auto s = std::move(store_);
    drop_owned(s, owner_);
  }
  bool closed() const { return !store_; }

 private:
  std::shared_ptr<store::Store> store_;
  std::string key_, text_;
  store::ObjectInfo info_;
  pid_t owner_ = ::getpid();
};

// One object being written: published atomically by commit(), nothing by abort(). Calls from
// several threads take turns (a close racing a write waits for it).
class Writer {
 public:
  Writer(client::ObjectRef ref, std::unique_ptr<store::Writer> w)
      : ref_(std::move(ref)), w_(std::move(w)) {}
  ~Writer() {
    if (w_ && ::getpid() == owner_) without_gil([&] { w_->abort(); });
    drop_owned(w_, owner_);
    drop_owned(ref_.store, owner_);
  }
  size_t write(py::handle buffer) {
    Borrowed mem(buffer, false, "write " + ref_.text);
    auto s = without_gil([&]() -> Status {
      std::lock_guard lock(mu_);
      if (!w_) return fail(Code::kInvalidArgument, "write to a closed file");
      Status st = w_->append(mem.bytes());
      if (!st) {
        w_->abort();
        w_.reset();
      }
      return st;
    });
    if (!s) raise(s.error().with_context(ref_.text));
    return mem.size();
  }
  void commit() {
    auto s = without_gil([&]() -> Status {
      std::lock_guard lock(mu_);
      if (!w_) return fail(Code::kInvalidArgument, "commit of a closed file");
      Status st = w_->commit();
      w_.reset();
      return st;
    });
    if (!s) raise(s.error().with_context(ref_.text));
  }
  void abort() {
    without_gil([&] {
      std::lock_guard lock(mu_);
      if (w_) w_->abort();
      w_.reset();
    });
  }
  uint64_t size() {
    std::lock_guard lock(mu_);
    return w_ ? w_->size() : 0;
  }
  bool closed() {
    std::lock_guard lock(mu_);
    return !w_;
  }

 private:
  client::ObjectRef ref_;
  std::mutex mu_;
  std::unique_ptr<store::Writer> w_;
  pid_t owner_ = ::getpid();
};

struct PySession {
  std::shared_ptr<client::Session> s;

  client::ObjectRef open(const std::string& uri, client::ObjectOpen how) const {
    auto r = without_gil([&] { return client::open_object(*s, uri, how); });
    return unwrap(std::move(r));
  }
  store::ObjectInfo stat(client::ObjectRef& ref) const {
    auto i = without_gil([&] { return ref.store->stat(ref.key); });
    if (!i) raise(i.error().with_context(ref.text));
    return *i;
  }
  // The object `uri` names, opened for reading at the version it has now.
  std::unique_ptr<Reader> reader(const std::string& uri, bool cache) const {
    auto ref = open(uri, {.through_cache = cache});
    auto info = stat(ref);
    return std::make_unique<Reader>(std::move(ref), std::move(info));
  }
};

PySession make_session(py::object home, py::object daemon, py::object cache_dir,
                       py::object cache_ram, py::object cache_size, py::object endpoint_url,
                       py::object profile, py::object region, py::object ledger) {
  client::SessionOverrides given;
  if (!home.is_none()) given.home = home.cast<std::string>();
  if (!cache_dir.is_none()) given.cache_dir = cache_dir.cast<std::string>();
  if (!cache_ram.is_none()) given.cache_ram = size_arg(cache_ram, "cache_ram", 0);
  if (!cache_size.is_none()) given.cache_size = size_arg(cache_size, "cache_size", 0);
  if (!daemon.is_none()) given.daemon_socket = daemon.cast<std::string>();
  if (!endpoint_url.is_none()) given.aws.endpoint_url = endpoint_url.cast<std::string>();
  if (!profile.is_none()) given.aws.profile = profile.cast<std::string>();
  if (!region.is_none()) given.aws.region = region.cast<std::string>();
  if (!ledger.is_none()) given.ledger = ledger.cast<std::string>();
  client::SessionOptions o =
      unwrap(client::session_options_from_environment(given, client::Profile::kLibrary));
  o.charging = client::ledger_charging();
  return PySession{std::make_shared<client::Session>(std::move(o))};
}

py::dict copy_summary(const client::CopySummary& s) {
  py::dict d;
  d["objects"] = s.objects;
  d["bytes"] = s.bytes;
  d["seconds"] = s.seconds;
  d["retries"] = s.retries;
  d["cancelled"] = s.cancelled;
  d["cached"] = s.cached;
  d["cache_hit_bytes"] = s.cache_hit_bytes;
  d["cache_miss_bytes"] = s.cache_miss_bytes;
  d["via_daemon"] = s.via_daemon;
  d["handoff_bytes"] = s.handoff_bytes;
  d["inline_bytes"] = s.inline_bytes;
  py::list failures;
  for (const auto& f : s.failures)
    failures.append(
        py::make_tuple(f.source, std::string(code_name(f.error.code())), f.error.message()));
  d["failures"] = failures;
  py::list skipped;
  for (const auto& k : s.skipped) skipped.append(py::make_tuple(k.key, k.reason));
  d["skipped"] = skipped;
  return d;
}

}  // namespace

client::Session& session_of(py::handle h) {
  return *h.cast<PySession&>().s;
}

void bind_objects(py::module_& m) {
  py::class_<PySession>(m, "Session", "A session: how sluice opens stores, caches and ledgers.")
      .def(py::init(&make_session), py::kw_only(), py::arg("home") = py::none(),
           py::arg("daemon") = py::none(), py::arg("cache_dir") = py::none(),
           py::arg("cache_ram") = py::none(), py::arg("cache_size") = py::none(),
           py::arg("endpoint_url") = py::none(), py::arg("profile") = py::none(),
           py::arg("region") = py::none(), py::arg("ledger") = py::none())
      .def_property_readonly("home", [](const PySession& p) { return p.s->options().home; })
      .def("cache_route",
           [](const PySession& p) {
             client::CacheRoute r = without_gil([&] { return p.s->cache_route(); });
             py::dict d;
             d["daemon"] = r.daemon;
             d["socket"] = r.socket;
             d["directory"] = r.directory;
             d["reason"] = r.reason;
             return d;
           })
      .def(
          "stat",
          [](const PySession& p, const std::string& uri, bool cache) {
            auto ref = p.open(uri, {.through_cache = cache});
            return info_dict(p.stat(ref));
          },
          py::arg("uri"), py::arg("cache") = false)
      .def(
          "open_reader",
          [](const PySession& p, const std::string& uri, bool cache) {
            return p.reader(uri, cache);
          },
          py::arg("uri"), py::arg("cache") = false)
      .def(
          "open_writer",
          [](const PySession& p, const std::string& uri, bool overwrite, bool durable,
             py::object size_hint) {
            auto ref = p.open(uri, {.writes = true});
            store::WriteOptions wo{.overwrite = overwrite, .durable = durable};
            if (!size_hint.is_none()) wo.size_hint = size_arg(size_hint, "size_hint", 0);
            auto w = without_gil([&] { return ref.store->create(ref.key, wo); });
            if (!w) raise(w.error().with_context(uri));
            return std::make_unique<Writer>(std::move(ref), std::move(*w));
          },
          py::arg("uri"), py::arg("overwrite") = true, py::arg("durable") = true,
          py::arg("size_hint") = py::none())
      .def(
          "read_into",
          [](const PySession& p, const std::string& uri, py::handle buffer, uint64_t offset,
             bool cache) { return p.reader(uri, cache)->read_into(buffer, offset); },
          py::arg("uri"), py::arg("buffer"), py::arg("offset") = 0, py::arg("cache") = false)
      .def(
          "copy",
          [](const PySession& p, const std::string& src, const std::string& dst, bool recursive,
             bool cache, bool durable, unsigned jobs) {
            client::CopyRequest r{.src = src,
                                  .dst = dst,
                                  .recursive = recursive,
                                  .jobs = jobs,
                                  .durable = durable,
                                  .cache = cache};
            auto s = without_gil([&] { return client::copy(*p.s, r); });
            return copy_summary(unwrap(std::move(s)));
          },
          py::arg("src"), py::arg("dst"), py::arg("recursive") = false, py::arg("cache") = false,
          py::arg("durable") = false, py::arg("jobs") = 16)
      .def(
          "remove",
          [](const PySession& p, const std::string& uri) {
            auto ref = p.open(uri, {});
            auto s = without_gil([&] { return ref.store->remove(ref.key); });
            if (!s) raise(s.error().with_context(uri));
          },
          py::arg("uri"))
      .def(
          "ls",
          [](const PySession& p, const std::string& uri, bool recursive) {
            std::vector<store::SkippedKey> skipped;
            auto r =
                without_gil([&] { return client::list_objects(*p.s, uri, recursive, &skipped); });
            py::list out, left_out;
            for (const auto& i : unwrap(std::move(r))) out.append(info_dict(i));
            for (const auto& k : skipped) left_out.append(py::make_tuple(k.key, k.reason));
            return py::make_tuple(out, left_out);
          },
          py::arg("uri"), py::arg("recursive") = false);

  py::class_<Reader>(m, "Reader", "One object opened for reading, pinned to one version.")
      .def("read_into", &Reader::read_into, py::arg("buffer"), py::arg("offset"))
      .def_property_readonly("size", [](const Reader& r) { return r.info().size; })
      .def_property_readonly("etag", [](const Reader& r) { return r.info().etag; })
      .def_property_readonly("closed", &Reader::closed)
      .def("close", &Reader::close);

  py::class_<Writer>(m, "Writer", "One object being written; published by commit().")
      .def("write", &Writer::write, py::arg("buffer"))
      .def("commit", &Writer::commit)
      .def("abort", &Writer::abort)
      .def_property_readonly("size", &Writer::size)
      .def_property_readonly("closed", &Writer::closed);
}

}  // namespace sluice::python

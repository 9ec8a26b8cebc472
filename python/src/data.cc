// Datasets and loaders: sluice.data's compiled half.
#include <pybind11/stl.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "core.h"
#include "sluice/client/datasets.h"
#include "sluice/core/sizes.h"
#include "sluice/stream/dataset.h"

namespace sluice::python {

namespace {

stream::Format format_arg(const std::string& f) {
  if (f == "auto") return stream::Format::kAuto;
  if (f == "tar" || f == "webdataset") return stream::Format::kTar;
  if (f == "objects") return stream::Format::kObjects;
  raise(Code::kInvalidArgument, "format '" + f + "' is not one of auto, tar and objects");
}

struct PyDataset {
  std::shared_ptr<stream::Dataset> ds;
  pid_t owner = ::getpid();
  ~PyDataset() { drop_owned(ds, owner); }
};

struct PyLoader {
  std::shared_ptr<const stream::Dataset> ds;
  std::unique_ptr<stream::Loader> loader;
  pid_t owner = ::getpid();
  ~PyLoader() {
    drop_owned(loader, owner);  // joins the read-ahead threads
    drop_owned(ds, owner);
  }

  // Up to n samples as WebDataset-style dicts: "__key__", "__index__" (the dataset-wide
  // sample number) and one bytes object per field.
  py::list next_batch(size_t n) {
    auto batch = without_gil([&] { return loader->next_batch(n); });
    if (!batch) raise(batch.error());
    py::list out;
    for (const stream::Sample& s : *batch) {
      py::dict d;
      d["__key__"] = py::str(s.key.data(), s.key.size());
      d["__index__"] = s.index;
      for (const stream::Field& f : s.fields)
        d[py::str(f.name)] = py::bytes(reinterpret_cast<const char*>(f.data.data()), f.data.size());
      out.append(std::move(d));
    }
    return out;
  }

  // Up to n samples with their fields' bytes copied back to back into the buffer
  // `alloc(total bytes)` returns (shared memory, which a DataLoader worker hands to the
  // main process by descriptor instead of pickling the bytes through a pipe): a list of
  // (key, index, ((field, offset, length), ...)) per sample; None at the end.
  py::object next_packed(size_t n, const py::function& alloc) {
    auto batch = without_gil([&] { return loader->next_batch(n); });
    if (!batch) raise(batch.error());
    if (batch->empty()) return py::none();
    uint64_t total = 0;
    for (const stream::Sample& s : *batch)
      for (const stream::Field& f : s.fields) total += f.data.size();
    py::object buffer = alloc(total);
    Borrowed dst(buffer, true, "the packed batch's buffer");
    if (dst.size() < total)
      raise(Code::kInvalidArgument, "the packed batch's buffer holds " +
                                        std::to_string(dst.size()) + " bytes, not " +
                                        std::to_string(total));
    py::list records;
    uint64_t at = 0;
    for (const stream::Sample& s : *batch) {
      py::tuple fields(s.fields.size());
      for (size_t i = 0; i < s.fields.size(); ++i) {
        const stream::Field& f = s.fields[i];
        fields[i] = py::make_tuple(py::str(f.name), at, f.data.size());
        at += f.data.size();
      }
      records.append(py::make_tuple(py::str(s.key.data(), s.key.size()), s.index, fields));
    }
    without_gil([&] {
      std::byte* out = dst.data();
      for (const stream::Sample& s : *batch)
        for (const stream::Field& f : s.fields) {
          std::memcpy(out, f.data.data(), f.data.size());
          out += f.data.size();
        }
      return 0;
    });
    return records;
  }
};

}  // namespace

void bind_data(py::module_& m) {
  py::class_<PyDataset>(m, "Dataset")
      .def_property_readonly("samples", [](const PyDataset& d) { return d.ds->samples(); })
      .def_property_readonly("bytes", [](const PyDataset& d) { return d.ds->bytes(); })
      .def_property_readonly("shards", [](const PyDataset& d) { return d.ds->shards().size(); })
      .def_property_readonly("fingerprint", [](const PyDataset& d) { return d.ds->fingerprint(); })
      .def_property_readonly("identity", [](const PyDataset& d) { return d.ds->identity(); })
      // Where the dataset is: the store's URI and the prefix in it ("file:///data/train",
      // "s3://bucket/train/"), whatever route it was read by: a state saved reading through
      // sluiced resumes through the embedded cache (a node whose daemon is down) or none.
      .def_property_readonly("location",
                             [](const PyDataset& d) {
                               std::string uri = d.ds->store().uri();
                               for (std::string_view route : {"node+", "cache+"})
                                 if (uri.starts_with(route)) uri.erase(0, route.size());
                               // A local folder by its real path (symlinks resolved).
                               if (uri.starts_with("file://")) {
                                 std::error_code ec;
                                 auto real = std::filesystem::weakly_canonical(uri.substr(7), ec);
                                 if (!ec && real.is_absolute()) {
                                   std::string path = real.string();
                                   if (uri.ends_with('/') && !path.ends_with('/')) path += '/';
                                   uri = "file://" + path;
                                 }
                               }
                               return uri + d.ds->prefix();
                             })
      .def_property_readonly("format",
                             [](const PyDataset& d) {
                               return d.ds->format() == stream::Format::kTar ? "tar" : "objects";
                             })
      .def("key", [](const PyDataset& d, uint64_t n) {
        if (n >= d.ds->samples())
          raise(Code::kInvalidArgument, "sample " + std::to_string(n) + " is past the dataset's " +
                                            std::to_string(d.ds->samples()));
        return d.ds->sample_key(n);
      });

  m.def(
      "open_dataset",
      [](py::handle session, const std::string& uri, bool cache, bool catalog,
         const std::string& format, bool skip_corrupt) {
        client::DatasetSpec spec{.uri = uri,
                                 .through_cache = cache,
                                 .catalog = catalog,
                                 .format = format_arg(format),
                                 .skip_corrupt = skip_corrupt};
        client::Session& s = session_of(session);
        auto ds = without_gil([&] { return client::open_dataset(s, spec); });
        if (!ds) raise(ds.error().with_context(uri));
        auto out = std::make_unique<PyDataset>();
        out->ds = std::const_pointer_cast<stream::Dataset>(*ds);
        return out;
      },
      py::arg("session"), py::arg("uri"), py::arg("cache") = true, py::arg("catalog") = true,
      py::arg("format") = "auto", py::arg("skip_corrupt") = false);

  py::class_<PyLoader>(m, "Loader")
      .def(py::init([](const PyDataset& pd, uint64_t seed, uint64_t epoch, uint64_t epochs,
                       unsigned rank, unsigned world, unsigned worker, unsigned workers,
                       uint64_t block, std::string resume, bool shuffle, uint64_t shuffle_window,
                       uint64_t memory_bytes, bool skip_corrupt) {
             stream::LoaderOptions o{.seed = seed,
                                     .epoch = epoch,
                                     .epochs = epochs,
                                     .rank = rank,
                                     .world = world,
                                     .worker = worker,
                                     .workers = workers,
                                     .block = block,
                                     .resume = std::move(resume),
                                     .shuffle = shuffle,
                                     .shuffle_window = shuffle_window,
                                     .memory_bytes = memory_bytes,
                                     .skip_corrupt = skip_corrupt};
             auto l = std::make_unique<PyLoader>();
             l->ds = pd.ds;
             l->loader = std::make_unique<stream::Loader>(pd.ds, std::move(o));
             return l;
           }),
           py::kw_only(), py::arg("dataset"), py::arg("seed") = 0, py::arg("epoch") = 0,
           py::arg("epochs") = 1, py::arg("rank") = 0, py::arg("world") = 1, py::arg("worker") = 0,
           py::arg("workers") = 1, py::arg("block") = 1, py::arg("resume") = "",
           py::arg("shuffle") = true, py::arg("shuffle_window") = 0,
           py::arg("memory_bytes") = uint64_t{256} << 20, py::arg("skip_corrupt") = false)
      .def("next_batch", &PyLoader::next_batch, py::arg("n"))
      .def("next_packed", &PyLoader::next_packed, py::arg("n"), py::arg("alloc"))
      .def("state", [](const PyLoader& l) { return l.loader->state(); })
      .def("stats", [](const PyLoader& l) {
        stream::LoaderStats s = l.loader->stats();
        py::dict d;
        d["samples"] = s.samples;
        d["bytes"] = s.bytes;
        d["requests"] = s.requests;
        d["read_bytes"] = s.read_bytes;
        d["throttled"] = s.throttled;
        d["skipped_samples"] = s.skipped_samples;
        d["window_parts"] = s.window_parts;
        d["first_batch_seconds"] = s.first_batch_seconds;
        d["stall_seconds"] = s.stall_seconds;
        d["elapsed_seconds"] = s.elapsed_seconds;
        return d;
      });

  m.def(
      "shuffle_window",
      [](const PyDataset& pd, bool shuffle, uint64_t shuffle_window, uint64_t memory_bytes) {
        return stream::Loader::shuffle_window_for(
            *pd.ds,
            {.shuffle = shuffle, .shuffle_window = shuffle_window, .memory_bytes = memory_bytes});
      },
      py::arg("dataset"), py::arg("shuffle"), py::arg("shuffle_window"), py::arg("memory_bytes"));
  m.def(
      "make_token",
      [](const PyDataset& pd, uint64_t epoch, uint64_t position, uint64_t seed, uint64_t window) {
        const stream::Dataset& ds = *pd.ds;
        if (position > ds.samples())
          raise(Code::kInvalidArgument, "position " + std::to_string(position) +
                                            " is past the dataset's " +
                                            std::to_string(ds.samples()) + " samples");
        return stream::make_token({.epoch = epoch,
                                   .position = position,
                                   .samples = ds.samples(),
                                   .fingerprint = ds.fingerprint(),
                                   .seed = seed,
                                   .window = window,
                                   .identity = ds.identity()});
      },
      py::arg("dataset"), py::arg("epoch"), py::arg("position"), py::arg("seed"),
      py::arg("window"));
}

}  // namespace sluice::python

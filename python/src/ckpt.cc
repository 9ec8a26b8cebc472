// Checkpoints: sluice.checkpoint's compiled half. Tensors come as (name, dtype, shape,
// memory) with memory a buffer or (address, nbytes), lent for the length of the call.
#include <pybind11/stl.h>

#include <memory>
#include <vector>

#include "core.h"
#include "sluice/client/checkpoints.h"
#include "sluice/client/session.h"

namespace sluice::python {

namespace {

struct PyHandle {
  std::shared_ptr<ckpt::SaveHandle> h;
  void wait() {
    auto s = without_gil([&] { return h->wait(); });
    check(s);
  }
  py::dict progress() const {
    ckpt::SaveProgress p = h->progress();
    py::dict d;
    d["step"] = p.step;
    d["bytes_total"] = p.bytes_total;
    d["bytes_staged"] = p.bytes_staged;
    d["finished"] = p.finished;
    py::list tiers;
    for (const auto& t : p.tiers) {
      py::dict td;
      td["tier"] = t.tier;
      td["state"] = ckpt::to_string(t.state);
      td["bytes_done"] = t.bytes_done;
      td["error"] = t.error ? py::object(py::str(t.error->message())) : py::none();
      tiers.append(td);
    }
    d["tiers"] = tiers;
    return d;
  }
};

struct PyCheckpointer {
  std::shared_ptr<ckpt::Checkpointer> cp_;
  std::string series;

  // The checkpointer for one call: a close() meanwhile waits for the call's end.
  std::shared_ptr<ckpt::Checkpointer> cp() const {
    auto c = cp_;
    if (!c) raise(Code::kInvalidArgument, "checkpointer of series " + series + " is closed");
    return c;
  }
  pid_t owner = ::getpid();
  ~PyCheckpointer() { drop_owned(cp_, owner); }  // waits for queued saves

  PyHandle save(uint64_t step, const py::list& tensors) {
    std::vector<std::unique_ptr<Borrowed>> lent;
    std::vector<ckpt::TensorView> views;
    for (py::handle item : tensors) {
      auto t = item.cast<py::tuple>();
      if (t.size() != 4)
        raise(Code::kInvalidArgument, "save: each tensor is (name, dtype, shape, memory)");
      ckpt::TensorView v;
      v.name = t[0].cast<std::string>();
      v.dtype = t[1].cast<std::string>();
      v.shape = t[2].cast<std::vector<int64_t>>();
      lent.push_back(std::make_unique<Borrowed>(t[3], false, "tensor " + v.name));
      v.data = lent.back()->data();
      v.bytes = lent.back()->size();
      if (v.data == nullptr) {  // an empty tensor: any valid address
        static const std::byte empty{};
        v.data = &empty;
      }
      views.push_back(std::move(v));
    }
    auto c = cp();
    auto h = without_gil([&] { return c->save(step, views); });
    return PyHandle{unwrap(std::move(h))};
  }

  py::dict restore(uint64_t step, const py::list& dests) {
    std::vector<std::unique_ptr<Borrowed>> lent;
    std::vector<ckpt::TensorDest> ds;
    for (py::handle item : dests) {
      auto t = item.cast<py::tuple>();
      if (t.size() != 3)
        raise(Code::kInvalidArgument, "restore: each tensor is (name, rank, memory)");
      ckpt::TensorDest d;
      d.name = t[0].cast<std::string>();
      d.rank = t[1].cast<int>();
      lent.push_back(std::make_unique<Borrowed>(t[2], true, "tensor " + d.name));
      d.data = lent.back()->data();
      d.bytes = lent.back()->size();
      ds.push_back(std::move(d));
    }
    auto c = cp();
    auto r = without_gil([&] { return c->restore(step, ds); });
    ckpt::RestoreReport rep = unwrap(std::move(r));
    py::dict d;
    d["bytes"] = rep.bytes;
    d["bytes_by_tier"] = rep.bytes_by_tier;
    d["chunks_failed_over"] = rep.chunks_failed_over;
    d["problems"] = rep.problems;
    d["seconds"] = rep.seconds;
    return d;
  }

  py::list manifest(uint64_t step) {
    auto c = cp();
    auto m = without_gil([&] { return c->manifest(step); });
    ckpt::Manifest man = unwrap(std::move(m));
    py::list out;
    for (const auto& shard : man.shards)
      for (const auto& t : shard.tensors) {
        py::dict d;
        d["name"] = t.name;
        d["dtype"] = t.dtype;
        d["shape"] = t.shape;
        d["bytes"] = t.bytes;
        d["rank"] = shard.rank;
        out.append(d);
      }
    return out;
  }
};

py::dict step_dict(const ckpt::StepInfo& s) {
  py::dict d;
  d["step"] = s.step;
  d["tiers"] = s.tiers;
  d["bytes"] = s.bytes;
  d["created_ns"] = s.created_ns;
  return d;
}

}  // namespace

void bind_ckpt(py::module_& m) {
  py::class_<PyHandle>(m, "SaveHandle")
      .def("wait", &PyHandle::wait)
      .def("progress", &PyHandle::progress);

  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def("save", &PyCheckpointer::save, py::arg("step"), py::arg("tensors"))
      .def("restore", &PyCheckpointer::restore, py::arg("step"), py::arg("dests"))
      .def("manifest", &PyCheckpointer::manifest, py::arg("step"))
      .def("flush",
           [](PyCheckpointer& c) {
             auto cp = c.cp();
             without_gil([&] { cp->flush(); });
           })
      .def("latest",
           [](PyCheckpointer& c) {
             auto cp = c.cp();
             auto r = without_gil([&] { return cp->latest(); });
             return unwrap(std::move(r));
           })
      .def("list",
           [](PyCheckpointer& c) {
             auto cp = c.cp();
             auto r = without_gil([&] { return cp->list(); });
             py::list out;
             for (const auto& s : unwrap(std::move(r))) out.append(step_dict(s));
             return out;
           })
      .def(
          "verify",
          [](PyCheckpointer& c, uint64_t step) {
            auto cp = c.cp();
            auto r = without_gil([&] { return cp->verify(step); });
            ckpt::VerifyReport rep = unwrap(std::move(r));
            py::dict d;
            d["chunks"] = rep.chunks;
            d["bad_chunks"] = rep.bad_chunks;
            d["problems"] = rep.problems;
            return d;
          },
          py::arg("step"))
      .def("close", [](PyCheckpointer& c) {
        auto cp = std::move(c.cp_);
        without_gil([&] { cp.reset(); });  // waits for queued saves
      });

  m.def(
      "open_checkpointer",
      [](py::handle session, const std::string& series, const std::vector<std::string>& tiers,
         unsigned rank, unsigned world, const std::string& run_id, uint64_t staging_bytes,
         unsigned keep_last, bool require_all, bool charge, const std::string& node_name,
         const std::string& node_secret_file, const std::string& peers, uint16_t peer_port) {
        client::Session& s = session_of(session);
        ckpt::CheckpointerOptions o;
        o.series = series;
        o.rank = rank;
        o.world = world;
        o.run_id = run_id;
        if (staging_bytes) o.staging_bytes = staging_bytes;
        client::CheckpointTiers t;
        t.uris = tiers;
        t.require_all = require_all;
        t.retention.keep_last = keep_last;
        t.writes = true;
        t.charge = charge;
        auto cp = without_gil([&]() -> Result<std::unique_ptr<ckpt::Checkpointer>> {
          SLUICE_ASSIGN_OR_RETURN(
              t.peers,
              client::peer_tier_settings({node_name, node_secret_file, peers, peer_port}, tiers));
          return client::open_checkpointer(s, std::move(o), t);
        });
        auto out = std::make_unique<PyCheckpointer>();
        out->cp_ = unwrap(std::move(cp));
        out->series = series;
        return out;
      },
      py::arg("session"), py::arg("series"), py::arg("tiers"), py::arg("rank") = 0,
      py::arg("world") = 1, py::arg("run_id") = "", py::arg("staging_bytes") = 0,
      py::arg("keep_last") = 0, py::arg("require_all") = true, py::arg("charge") = true,
      py::arg("node_name") = "", py::arg("node_secret_file") = "", py::arg("peers") = "",
      py::arg("peer_port") = 0);
}

}  // namespace sluice::python

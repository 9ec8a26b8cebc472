// sluice._core: the Python package's compiled core (python/sluice/ is the API users see).
#include "core.h"

PYBIND11_MODULE(_core, m) {
  m.doc() = "sluice's compiled core; use the sluice package, not this module";
  sluice::python::bind_errors(m);
  sluice::python::bind_objects(m);
  sluice::python::bind_data(m);
  sluice::python::bind_ckpt(m);
  sluice::python::bind_io(m);
}

// The Python module ringreduce._C: the backend class and build facts. Nothing else lives here.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend/ring_backend.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringreduce: ring collectives as a torch.distributed backend";
  // Registers c10d's Python types (Backend, Store) so pybind11 can use them as base and argument.
  py::module_::import("torch.distributed");

  py::class_<ringreduce::RingBackend, c10d::Backend, c10::intrusive_ptr<ringreduce::RingBackend>>(
      m, "RingBackend")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, std::chrono::milliseconds>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("slice_bytes",
                             [](const ringreduce::RingBackend& b) { return b.config().slice_bytes; })
      .def_property_readonly("slots", [](const ringreduce::RingBackend& b) { return b.config().slots; })
      .def_property_readonly(
          "spin_us", [](const ringreduce::RingBackend& b) { return b.config().spin.count(); })
      .def("linked_segments", &ringreduce::RingBackend::linked_segments,
           "Shared-memory segments of this group still linked in /dev/shm (empty once set up).");

  m.attr("built_with_cuda") = false;
  // The torch this extension was compiled against (setup.py passes it): its C++ ABI is not stable
  // across torch releases, so the Python side compares it with the running torch.
  m.attr("torch_version") = RINGREDUCE_TORCH_VERSION;
}

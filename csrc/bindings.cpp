// The Python module ringreduce._C: the backend class and build facts. Nothing else lives here.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend/ring_backend.h"
#include "bucket/buckets.h"

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
           "Shared-memory segments of this group still linked in /dev/shm (empty once set up).")
      .def_property_readonly(
          "transport",
          [](const ringreduce::RingBackend& b) { return ringreduce::transport_mode_name(b.config().transport); })
      .def_property_readonly("tcp_sockets",
                             [](const ringreduce::RingBackend& b) { return b.config().tcp_sockets; })
      .def("tcp_peers", &ringreduce::RingBackend::tcp_peers,
           "Ranks of this group reached over TCP (those whose shared memory is not reachable).")
      .def("tcp_address", &ringreduce::RingBackend::tcp_address,
           "The ip:port this rank listens on for its TCP peers, '' without any.");

  // Gradient buckets of ringreduce.DistributedDataParallel (see bucket/buckets.h).
  using ringreduce::Buckets;
  py::class_<Buckets>(m, "Buckets")
      .def(py::init<std::vector<at::Tensor>, int64_t, int64_t>(), py::arg("params"),
           py::arg("first_bucket_bytes"), py::arg("bucket_bytes"))
      .def_property_readonly("num_buckets", &Buckets::num_buckets)
      .def_property_readonly("num_params", &Buckets::num_params)
      .def("buffer", &Buckets::buffer, py::arg("bucket"))
      .def("set_buffer", &Buckets::set_buffer, py::arg("bucket"), py::arg("tensor"))
      .def("params_of", &Buckets::params_of, py::arg("bucket"))
      .def("views_of", &Buckets::views_of, py::arg("bucket"))
      .def("bucket_of", &Buckets::bucket_of, py::arg("param"))
      .def("view", &Buckets::view, py::arg("param"))
      .def("prepare", &Buckets::prepare, py::arg("scale"), py::arg("unused"),
           py::arg("single_in_place"))
      .def("reduce_target", &Buckets::reduce_target, py::arg("bucket"))
      .def("in_place", &Buckets::in_place, py::arg("bucket"))
      .def("mark_ready", &Buckets::mark_ready, py::arg("param"), py::arg("grad_as_view"))
      .def("mark_unused", &Buckets::mark_unused, py::arg("param"))
      .def_property_readonly("num_ready", &Buckets::num_ready)
      .def("pending_params", &Buckets::pending_params)
      .def_property_readonly("all_started", &Buckets::all_started)
      .def_property_readonly("in_iteration", &Buckets::in_iteration)
      .def("ready_when_started", &Buckets::ready_when_started)
      .def("write_back", &Buckets::write_back, py::arg("bucket"), py::arg("used"),
           py::arg("grad_as_view"))
      .def("end_iteration", &Buckets::end_iteration);

  m.attr("built_with_cuda") = false;
  // The torch this extension was compiled against (setup.py passes it): its C++ ABI is not stable
  // across torch releases, so the Python side compares it with the running torch.
  m.attr("torch_version") = RINGREDUCE_TORCH_VERSION;
}

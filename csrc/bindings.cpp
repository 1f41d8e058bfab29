// The Python module ringreduce._C: the backend class, the DDP buckets, the TCP wire checks (for
// the fuzz tests), the knob table and build facts. Nothing else lives here.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include <cstring>

#include "algo/select.h"
#include "backend/direct_ops.h"
#include "backend/knobs.h"
#include "backend/ring_backend.h"
#include "backend/queued_op.h"
#include "backend/work.h"
#include "bucket/buckets.h"
#include "reduce/reduce.h"
#include "transport/registry.h"
#include "transport/tcp/wire.h"

namespace py = pybind11;

namespace {

// A wire struct from exactly sizeof(T) bytes handed over from Python.
template <class T>
T wire_struct(const py::bytes& bytes, const char* what) {
  const std::string d = bytes;
  if (d.size() != sizeof(T)) {
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(sizeof(T)) + " bytes expected");
  }
  T out;
  std::memcpy(&out, d.data(), sizeof out);
  return out;
}

// A list of rows as a Python list of dicts, each filled by fill(dict, row).
template <class Row, class Fill>
py::list as_dicts(const std::vector<Row>& rows, Fill fill) {
  py::list out;
  for (const Row& r : rows) {
    py::dict d;
    fill(d, r);
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringreduce: ring collectives as a torch.distributed backend";
  // Registers c10d's Python types (Backend, Store) so pybind11 can use them as base and argument.
  py::module_::import("torch.distributed");

  // The Work of an op, registered so that (1) pybind11 finds the type of the Work an op returns at
  // its first lookup instead of missing twice in its type maps and falling back to c10d's Work, and
  // (2) wait() on a Work that has already completed (every synchronous op run at its call, which
  // dist.all_reduce waits for at once) returns without releasing and retaking the GIL, as c10d's
  // binding of Work.wait does for every call. Everything else is c10d's Work as before.
  py::class_<ringreduce::RingWork, c10d::Work, c10::intrusive_ptr<ringreduce::RingWork>>(m, "RingWork")
      .def(
          "wait",
          [](ringreduce::RingWork& w, std::chrono::milliseconds timeout) {
            if (w.ended()) return w.wait(timeout);  // returns at once, or throws the op's error
            py::gil_scoped_release no_gil;
            return w.wait(timeout);
          },
          py::arg("timeout") = kNoTimeout,
          "Waits for the op (as c10d's Work.wait), and re-raises its error");
  // A queued op's Work (async ops, and whatever did not run at its call) found at once too. With
  // this holder (not c10d's, which lets go of a Work with the GIL released) the last reference
  // to its tensors goes with the GIL held, where c10d's took it again to release their Python
  // objects.
  py::class_<ringreduce::QueuedOp, ringreduce::RingWork, c10::intrusive_ptr<ringreduce::QueuedOp>>(
      m, "QueuedOp");

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
      .def_property_readonly(
          "spin_max_us", [](const ringreduce::RingBackend& b) { return b.config().spin_max.count(); })
      .def_property_readonly("async_start_us",
                             [](const ringreduce::RingBackend& b) { return b.config().async_start.count(); })
      .def("algorithm", &ringreduce::RingBackend::algorithm, py::arg("op"), py::arg("nbytes"),
           "The algorithm (ring, oneshot, twoshot) a call of `op` with `nbytes` per rank takes here")
      .def("set_algorithm", &ringreduce::RingBackend::set_algorithm, py::arg("name"),
           "Force auto|ring|oneshot|twoshot for this group; call it on every rank between ops")
      .def_property_readonly("algorithms", [](const ringreduce::RingBackend& b) { return b.algorithms(); })
      .def_property_readonly("segments", &ringreduce::RingBackend::segments,
                             "How the group's shared-memory segments were made: memfd (no name), "
                             "/dev/shm (named, unlinked once mapped) or none")
      .def("linked_segments", &ringreduce::RingBackend::linked_segments,
           "Shared-memory segments of this group still linked in /dev/shm (empty once set up).")
      .def_property_readonly(
          "transport",
          [](const ringreduce::RingBackend& b) { return b.config().transport; })
      .def_property_readonly("check_fingerprints",
                             [](const ringreduce::RingBackend& b) { return b.config().check_fingerprints; })
      .def_property_readonly(
          "stream", [](const ringreduce::RingBackend& b) {
            return std::string(ringreduce::SlotWrites::name(b.config().stream));
          })
      .def_property_readonly(
          "local_ranks", [](const ringreduce::RingBackend& b) { return b.config().local_ranks_seen; },
          "The ranks on rank 0's machine, which the crowded-core defaults were chosen for")
      .def_property_readonly("stream_bytes",
                             [](const ringreduce::RingBackend& b) { return b.config().stream_bytes; })
      .def_property_readonly("tcp_sockets",
                             [](const ringreduce::RingBackend& b) { return b.config().tcp_sockets; })
      .def("tcp_peers", &ringreduce::RingBackend::tcp_peers,
           "Ranks of this group reached over TCP (those whose shared memory is not reachable).")
      .def("cuda_transport", &ringreduce::RingBackend::cuda_transport,
           "How CUDA tensors travel in this group: 'cuda_ipc', 'staged', or '' before its first "
           "CUDA op")
      .def("tcp_address", &ringreduce::RingBackend::tcp_address,
           "The ip:port this rank listens on for its TCP peers, '' without any.")
      .def("dump_flight_recorder", &ringreduce::RingBackend::dump_flight_recorder,
           py::arg("directory") = "", py::arg("reason") = "requested",
           "Writes this rank's flight recorder of the group (its last ops) to a JSON file in "
           "`directory` (RINGREDUCE_FLIGHT_DIR when empty) and returns its path.")
      .def_property_readonly("flight_dir", &ringreduce::RingBackend::flight_dir)
      .def_property_readonly("flight_capacity", &ringreduce::RingBackend::flight_capacity)
      .def_property_readonly("flight_group", &ringreduce::RingBackend::flight_group,
                             "The group's name in flight-recorder dumps (the same on every rank).");

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
           py::arg("solo_in_place"))
      .def("reduce_targets", &Buckets::reduce_targets, py::arg("bucket"))
      .def("in_place", &Buckets::in_place, py::arg("param"))
      .def("solo", &Buckets::solo, py::arg("param"))
      .def("mark_ready", &Buckets::mark_ready, py::arg("param"), py::arg("grad_as_view"))
      .def("mark_unused", &Buckets::mark_unused, py::arg("param"))
      .def_property_readonly("num_ready", &Buckets::num_ready)
      .def("pending_params", &Buckets::pending_params)
      .def_property_readonly("all_started", &Buckets::all_started)
      .def_property_readonly("in_iteration", &Buckets::in_iteration)
      .def("write_back", &Buckets::write_back, py::arg("bucket"), py::arg("used"),
           py::arg("grad_as_view"))
      .def("end_iteration", &Buckets::end_iteration);

  // The checks the TCP transport applies to what it reads from a socket (transport/tcp/wire.h),
  // on raw bytes, so that fuzz tests reach exactly the code a hostile peer would.
  namespace tcp = ringreduce::tcp;
  py::module_ wire = m.def_submodule("wire", "The TCP transport's checks of hellos and frames.");
  wire.attr("HELLO_BYTES") = sizeof(tcp::Hello);
  wire.attr("HELLO_MAGIC") = tcp::kHelloMagic;
  wire.attr("WIRE_VERSION") = tcp::kWireVersion;
  wire.attr("SECRET_BYTES") = tcp::kSecretBytes;
  wire.attr("MAX_REASON_BYTES") = tcp::kMaxReasonBytes;
  wire.attr("STATE_BYTES") = sizeof(tcp::StateBody);
  wire.attr("MSG_HEADER_BYTES") = sizeof(ringreduce::MsgHeader);
  wire.def("group_id", &tcp::group_id, py::arg("prefix"));
  wire.def(
      "check_hello",
      [](py::bytes data, int world, uint32_t sockets, uint64_t group, uint64_t slot_bytes,
         py::bytes secret) {
        const std::string d = data, sec = secret;
        tcp::HelloExpect e;
        e.world = world;
        e.sockets = sockets;
        e.group = group;
        e.slot_bytes = slot_bytes;
        if (sec.size() != tcp::kSecretBytes) throw std::invalid_argument("secret: 16 bytes expected");
        std::memcpy(e.secret, sec.data(), tcp::kSecretBytes);
        tcp::Hello out;
        return tcp::check_hello(d.data(), d.size(), e, &out);
      },
      py::arg("data"), py::arg("world"), py::arg("sockets"), py::arg("group"), py::arg("slot_bytes"),
      py::arg("secret"), "'' when `data` is a hello this group accepts, else why not.");
  wire.def(
      "check_frame_head",
      [](uint32_t type, uint32_t len, size_t slot_bytes) {
        tcp::FrameHead h;
        h.type = type;
        h.len = len;
        return tcp::check_frame_head(h, slot_bytes);
      },
      py::arg("type"), py::arg("len"), py::arg("slot_bytes"));
  wire.def(
      "check_data_header",
      [](py::bytes header, uint32_t len) {
        return tcp::check_data_header(wire_struct<ringreduce::MsgHeader>(header, "header"), len);
      },
      py::arg("header"), py::arg("len"));
  wire.def(
      "check_state_body",
      [](py::bytes body, int world) {
        return tcp::check_state_body(wire_struct<tcp::StateBody>(body, "body"), world);
      },
      py::arg("body"), py::arg("world"));

  m.def("reduce_tensors", &ringreduce::reduce_tensors, py::arg("dst"), py::arg("a"), py::arg("b"),
        py::arg("op"),
        "dst = a op b with ringreduce's own kernels (CPU, or CUDA on the current stream), for "
        "tests and the kernel benchmark; op is 'sum', 'product', 'min', 'max', 'band', 'bor' or 'bxor'");
  m.def("_time_all_reduce_", &ringreduce::time_all_reduce, py::arg("tensor"), py::arg("iters"),
        py::arg("group") = "", py::call_guard<py::gil_scoped_release>(),
        "Seconds that `iters` calls of torch.ops.ringreduce.all_reduce_(tensor, 'sum', group) take "
        "when looped in C++ (benchmarks/peers.py's rr-c++ column)");
  // The GIL stays held: a backend written in Python (a c10d::Backend subclass there) needs it.
  m.def("_time_backend_all_reduce_", &ringreduce::time_backend_all_reduce, py::arg("tensor"),
        py::arg("iters"), py::arg("group") = "", py::arg("async_op") = false,
        "Seconds that `iters` calls of the group's backend's allreduce([tensor]) and wait() take "
        "when looped in C++, for any backend (benchmarks/call_path.py's sync-c++ and async-c++ rows)");
#ifdef RINGREDUCE_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  // The torch this extension was compiled against (setup.py passes it): its C++ ABI is not stable
  // across torch releases, so the Python side compares it with the running torch.
  m.attr("torch_version") = RINGREDUCE_TORCH_VERSION;
  m.attr("version") = RINGREDUCE_VERSION;
  m.def("default_flight_dir", &ringreduce::FlightRecorder::default_dir,
        "Where flight-recorder dumps go unless a directory is named: RINGREDUCE_FLIGHT_DIR, else "
        "$TMPDIR/ringreduce-flight (/tmp/ringreduce-flight without TMPDIR).");
  m.def(
      "knobs",
      [] {
        py::list out;
        for (const ringreduce::Knob& k : ringreduce::kKnobs) {
          py::dict d;
          d["name"] = k.name;
          d["default"] = k.default_text;
          d["kind"] = ringreduce::knob_kind_name(k.kind);
          d["scope"] = ringreduce::knob_scope_name(k.scope);
          d["meaning"] = k.meaning;
          out.append(d);
        }
        return out;
      },
      "Every RINGREDUCE_* environment variable (backend/knobs.h), each a dict of name, default "
      "(as docs/knobs.md gives it), kind, scope ('agreed', 'per rank', 'per process', 'build', "
      "'test') and meaning.");
  m.def(
      "algorithms",
      [] {
        return as_dicts(ringreduce::algorithm_list(), [](py::dict& d, const ringreduce::AlgoInfo& a) {
          d["name"] = a.name;
          d["serves"] = a.serves;
          d["what"] = a.what;
        });
      },
      "Every value of RINGREDUCE_ALGO and set_algorithm (algo/select.h's list), each a dict of "
      "name, serves (the collectives it carries where it applies) and what.");
  m.def(
      "transports",
      [] {
        return as_dicts(ringreduce::transport_kinds(), [](py::dict& d, const ringreduce::TransportKind& k) {
          d["name"] = k.name;
          d["same_host"] = k.same_host;
        });
      },
      "The transports a group may reach its peers by, in order of preference (transport/registry.h), "
      "each a dict of name (a value of RINGREDUCE_TRANSPORT) and same_host (it reaches only peers "
      "on this rank's host).");
  m.def("simd_level", &ringreduce::simd_level,
        "Which copy of the CPU reduction loops this process runs (chosen from the CPU at load time)");
}

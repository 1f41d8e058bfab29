#include "backend/cuda_side.h"

#include "algo/collectives.h"
#include "algo/messages.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <thread>

#include "backend/cuda_ordered.h"
#include "backend/store_bootstrap.h"
#include "backend/work.h"
#include "common/error.h"
#include "common/log.h"
#include "reduce/reduce_cuda.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/device_window.h"

namespace ringreduce {

namespace {

// Whether the caller's current stream on `device` is being captured into a CUDA graph.
bool capturing(const c10::Device& device) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &st));
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace

struct CudaSide::Impl {
  Impl(c10::intrusive_ptr<c10d::Store> s, std::string p, int r, int n, const Config& c, Transport& h,
       std::function<void(uint64_t, const std::string&)> f)
      : store(std::move(s)), prefix(std::move(p)), rank(r), size(n), cfg(c), host(h), finished(std::move(f)) {}

  bool set_up() const { return coll_ != nullptr; }

  // The device ring, built at the first CUDA op (by its caller, under setup_mu; afterwards only
  // the progress thread uses it).
  Collectives& ring() {
    if (coll_) return *coll_;
    kernels = std::make_unique<cuda::CudaKernels>(comm->stream());
    std::string why;
    if (cfg.cuda_transport == "staged") {
      why = "RINGREDUCE_CUDA_TRANSPORT=staged";
    } else {
      try {
        StoreBootstrap bs(store);
        CudaIpcConfig ic;
        ic.slot_bytes = cfg.cuda_slice_bytes;
        ic.nslots = cfg.slots;
        ic.spin = cfg.spin;
        ic.spin_max = cfg.spin_max;
        ic.device = device->index();
        ic.stream = comm->stream();
        auto t = std::make_unique<CudaIpcTransport>(bs, prefix + "cuda/", rank, size, ic);
        ipc = t.get();
        transport = std::move(t);
        msgs_ = std::make_unique<Messages>(*transport, cfg.cuda_slice_bytes, *kernels);
        set_up_ordered(bs);
      } catch (const CudaIpcUnavailable& e) {
        if (cfg.cuda_transport == "ipc") {
          throw Error(detail::cat("ringreduce: rank ", rank, ": RINGREDUCE_CUDA_TRANSPORT=ipc, but ",
                                  "CUDA IPC cannot join this group's ranks: ", e.what()));
        }
        why = e.what();
        // Said once per group, by rank 0 (every rank reached the same verdict).
        if (rank == 0) {
          log::note(rank, detail::cat("CUDA tensors of this group travel through host memory: ",
                                      e.what(), " (RINGREDUCE_CUDA_TRANSPORT=staged chooses this ",
                                      "without the probe, and without this line)"));
        }
      }
    }
    if (!msgs_) {
      transport = std::make_unique<StagedTransport>(host, device->index(), comm->stream());
      msgs_ = std::make_unique<Messages>(*transport, cfg.slice_bytes, *kernels);
    }
    msgs_->set_check_fingerprints(cfg.check_fingerprints);
    // Device memory has no shared window: the selector, told so, sends every size around the ring,
    // whatever RINGREDUCE_ALGO forces for host tensors. A forced algorithm that does not apply
    // here is said once per group, by rank 0, rather than ignored in silence.
    const Selector selector(size, 0, cfg.algo);
    if (rank == 0 && cfg.algo != Algo::Auto && cfg.algo != Algo::Ring) {
      log::note(rank, detail::cat("RINGREDUCE_ALGO=", algo_name(cfg.algo), " does not apply to CUDA ",
                                  "tensors (device memory has no shared window): they take the ring"));
    }
    coll_ = std::make_unique<Collectives>(*msgs_, nullptr, selector);
    std::lock_guard<std::mutex> lock(mu);
    name = ipc ? "cuda_ipc" : "staged";
    return *coll_;
  }

  // The stream-ordered all-reduce, over a device window beside the IPC transport: unless it is
  // turned off, and unless some rank cannot have one (every rank then learns why, and all of
  // them take the ring).
  void set_up_ordered(Bootstrap& bs) {
    if (cfg.cuda_window_bytes == 0 || cfg.algo == Algo::Ring) return;
    try {
      auto w = std::make_unique<DeviceWindow>(bs, prefix + "cuda/win/", rank, size, cfg.cuda_window_bytes,
                                              device->index());
      ordered = std::make_unique<CudaOrdered>(std::move(w), host.control(), finished);
    } catch (const CudaIpcUnavailable& e) {
      if (rank == 0) {
        log::note(rank, detail::cat("CUDA all-reduces of this group take the ring, with a host wait per ",
                                    "message: ", e.what()));
      }
    }
  }

  c10::intrusive_ptr<c10d::Store> store;
  std::string prefix;
  int rank, size;
  Config cfg;
  Transport& host;
  std::function<void(uint64_t, const std::string&)> finished;
  std::unique_ptr<CudaOrdered> ordered;  // null: every CUDA op takes the ring

  mutable std::mutex mu;  // device, comm and name, read by callers' threads
  std::mutex setup_mu;    // the ring's set-up, by the first caller
  std::optional<c10::Device> device;
  std::optional<c10::cuda::CUDAStream> comm;  // torch's pool owns it
  std::string name;

  std::unique_ptr<cuda::CudaKernels> kernels;
  std::unique_ptr<Transport> transport;
  CudaIpcTransport* ipc = nullptr;  // transport, when it is the IPC one
  std::unique_ptr<Messages> msgs_;
  std::unique_ptr<Collectives> coll_;  // over msgs_
};

CudaSide::CudaSide(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size,
                   const Config& cfg, Transport& host,
                   std::function<void(uint64_t, const std::string&)> finished)
    : impl_(std::make_unique<Impl>(std::move(store), std::move(prefix), rank, size, cfg, host,
                                   std::move(finished))) {}

CudaSide::~CudaSide() {
  Impl& m = *impl_;
  if (!m.ordered) return;
  // The stream-ordered ops end first (or fail, their waits released), and the group's stream
  // with them, so that nothing of this rank touches a peer's window any more. A rank's window is
  // freed only once every rank has got that far: freeing memory that another process still maps
  // is undefined. Ranks that do not all get there within a few seconds (one died, or destroys its
  // group much later) leave their windows to the process's end.
  bool everyone = false;
  try {
    m.ordered->quiesce();
    c10::cuda::CUDAGuard guard(*m.device);
    // A graph's replays run on the stream it was launched on, not the group's.
    if (m.ordered->captured()) cudaDeviceSynchronize();
    else cudaStreamSynchronize(m.comm->stream());
    StoreBootstrap bs(m.store);
    const std::string key = m.prefix + "cuda/win/closing";
    bs.add(key, 1);
    const Deadline dl = Deadline::after(std::chrono::seconds(5));
    while (!(everyone = bs.add(key, 0) >= m.size) && !dl.passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (...) {
    // The store may be gone with rank 0's process: then the window stays.
  }
  if (!everyone) m.ordered->keep_window_memory();
  m.ordered.reset();
}

c10::cuda::CUDAStream CudaSide::comm_stream(const char* op, const c10::Device& device) {
  Impl& m = *impl_;
  c10::cuda::CUDAStream comm = [&] {
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.device) {
      m.device = device;
      m.comm = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index());
    } else if (*m.device != device) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat(op_prefix(op, m.rank), "got a tensor on ", device,
                                  ", but this group's CUDA ops run on ", *m.device,
                                  " (one device per rank and group)"));
    }
    return *m.comm;
  }();
  c10::cuda::CUDAGuard guard(device);
  // The device transport is set up here, on the caller's thread, while no op of this group
  // runs: its set-up (cudaMalloc, cudaIpcOpenMemHandle) may synchronise the whole device.
  {
    std::lock_guard<std::mutex> lock(m.setup_mu);
    if (!m.set_up() && capturing(device)) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat(op_prefix(op, m.rank), "the group's first CUDA op cannot be captured in a ",
                                  "CUDA graph: it sets up device memory that the ranks share (cudaMalloc, ",
                                  "CUDA IPC), which a capture forbids; run one op of the group before ",
                                  "capturing (docs/cuda.md)"));
    }
    m.ring();
  }
  return comm;
}

bool CudaSide::takes_ordered_allreduce(const char* op, const c10::Device& device, RedOp red,
                                       int64_t divisor) {
  comm_stream(op, device);
  return impl_->ordered && impl_->ordered->takes_allreduce(red, divisor);
}

c10::intrusive_ptr<c10d::Work> CudaSide::ordered_allreduce(const char* op, uint64_t seq,
                                                           const at::Tensor& in, const at::Tensor& out,
                                                           const at::Tensor& result, DType t, RedOp red,
                                                           std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  const c10::Device device = out.device();
  c10::cuda::CUDAStream comm = comm_stream(op, device);
  c10::cuda::CUDAGuard guard(device);
  return m.ordered->allreduce(op, seq, m.rank, in, out, result, t, red, timeout, comm,
                              c10::cuda::getCurrentCUDAStream(device.index()));
}

std::function<void(const OpContext&, const Deadline&)> CudaSide::prepare(
    const char* op, const c10::Device& device, const std::vector<at::Tensor>& used, RingBody body) {
  c10::cuda::CUDAStream comm = comm_stream(op, device);
  c10::cuda::CUDAGuard guard(device);
  if (capturing(device)) {
    // The ring's ops run on the progress thread and wait for their stream on the host.
    C10_THROW_ERROR(DistBackendError,
                    detail::cat(op_prefix(op, impl_->rank), "cannot be captured in a CUDA graph: only ",
                                "all-reduces on the stream-ordered path can (sum, product, min, max and ",
                                "the bitwise ops; not avg, nor groups of more than ",
                                DeviceOneShot::kMaxRanks, " ranks: docs/cuda.md)"));
  }
  // The caller's stream has queued the work that produces the inputs: the op starts after it.
  auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDisableTiming);
  ready->record(c10::cuda::getCurrentCUDAStream(device.index()));
  for (const at::Tensor& t : used) {
    if (t.defined() && t.is_cuda()) t.record_stream(comm);
  }
  return [this, device, comm, ready, body = std::move(body)](const OpContext& ctx, const Deadline& dl) {
    Impl& m = *impl_;
    const std::string host_abort = m.host.control().abort_reason();
    if (!host_abort.empty()) {
      if (m.ipc) m.ipc->control().abort_group(host_abort);
      throw AbortedError(detail::cat(op_prefix(ctx.name, ctx.seq, m.rank),
                                     "the group was aborted: ", host_abort));
    }
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::CUDAStreamGuard on_comm(comm);
    ready->block(comm);
    try {
      body(m.ring(), ctx, dl);
      const cudaError_t err = cudaStreamSynchronize(comm.stream());
      if (err != cudaSuccess) {
        cudaGetLastError();
        throw Error(detail::cat(op_prefix(ctx.name, ctx.seq, m.rank),
                                "a CUDA kernel of the op failed: ", cudaGetErrorString(err)));
      }
    } catch (...) {
      // The two control planes fail together: a peer in a later CPU op of the group must not
      // wait for this rank until its deadline.
      if (m.ipc) {
        const std::string why = m.ipc->control().abort_reason();
        if (!why.empty()) m.host.control().abort_group(why);
      }
      cudaStreamSynchronize(comm.stream());  // nothing of the op runs on after it failed
      throw;
    }
  };
}

std::string CudaSide::transport_name() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->name;
}

void CudaSide::abort_group(const std::string& why) {
  if (impl_->ipc) impl_->ipc->control().abort_group(why);
  if (impl_->ordered) impl_->ordered->abort(why);  // exit-ok: the group's device ops
}

std::vector<std::string> CudaSide::linked_segments() const {
  return impl_->ipc ? impl_->ipc->linked_segments() : std::vector<std::string>{};
}

}  // namespace ringreduce

#include "backend/ring_backend.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <utility>

#include "backend/monitored_barrier.h"
#include "backend/sparse.h"
#include "backend/storage_pins.h"
#include "backend/store_bootstrap.h"
#ifdef RINGREDUCE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "reduce/reduce_cuda.h"
#endif
#include "common/error.h"
#include "common/log.h"
#include "p2p/p2p.h"
#include "reduce/reduce.h"
#include "algo/collectives.h"
#include "ring/ring.h"
#include "transport/links.h"

namespace ringreduce {

namespace {

#ifdef RINGREDUCE_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

// Why this build has no CUDA side, as setup.py found at build time.
[[maybe_unused]] const char* cuda_build_note() {
#ifdef RINGREDUCE_CUDA_NOTE
  return RINGREDUCE_CUDA_NOTE;
#else
  return "built without CUDA";
#endif
}

// The torch layer's one dtype dispatch point: at::ScalarType to the core's tag.
std::optional<DType> core_dtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kByte: return DType::UInt8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kBool: return DType::Bool;
    case at::kComplexFloat: return DType::Complex64;
    case at::kComplexDouble: return DType::Complex128;
    default: return std::nullopt;
  }
}

// What a c10d::ReduceOp means for the ring: a kernel op, plus AVG's divisor or PREMUL_SUM's factor.
struct Reduction {
  RedOp op = RedOp::Sum;
  int64_t divisor = 1;
  std::optional<double> premul;
};

[[noreturn]] void fail(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

// The host of the TCPStore behind `store` (through PrefixStores), "" for other stores: TCP peers
// listen on the local address that reaches it, which is the network the job was launched on.
std::string store_host(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> s = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get())) s = prefixed->getUnderlyingNonPrefixStore();
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) return tcp->getHost();
  if (const char* addr = std::getenv("MASTER_ADDR")) return addr;
  return "";
}

// Flight recorder knobs, read per rank (a dump directory is a local matter):
// RINGREDUCE_FLIGHT_RECORDER (ops kept per group, 0 to record none) and RINGREDUCE_FLIGHT_DIR.
size_t flight_capacity_from_env(int rank) {
  const char* v = std::getenv("RINGREDUCE_FLIGHT_RECORDER");
  if (v == nullptr || *v == '\0') return 1000;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0 || n > (1 << 24)) {
    fail(detail::cat("ringreduce: rank ", rank, ": RINGREDUCE_FLIGHT_RECORDER=", v,
                     " is not a number of ops in [0, 16777216]"));
  }
  return static_cast<size_t>(n);
}

// The shapes of an op's tensors for the flight recorder, each ended by -1, into a buffer this
// thread reuses (no allocation per op once it has grown).
const std::vector<int64_t>& dims_of(const std::vector<at::Tensor>& ts) {
  thread_local std::vector<int64_t> dims;
  dims.clear();
  for (const at::Tensor& t : ts) {
    for (int64_t d : t.sizes()) dims.push_back(d);
    dims.push_back(-1);
  }
  return dims;
}

}  // namespace

void reduce_tensors(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                    const std::string& op) {
  const char* name = "reduce_tensors";
  auto check = [&](const at::Tensor& t, const char* what) {
    if (!t.defined() || !t.is_contiguous() || t.device() != dst.device() ||
        t.scalar_type() != dst.scalar_type() || t.numel() != dst.numel()) {
      fail(detail::cat("ringreduce ", name, ": ", what, " must be a contiguous tensor shaped like dst (",
                       dst.numel(), " elements of ", dst.scalar_type(), " on ", dst.device(), ")"));
    }
  };
  check(dst, "dst");
  check(a, "a");
  check(b, "b");
  const auto d = core_dtype(dst.scalar_type());
  if (!d) fail(detail::cat("ringreduce ", name, ": dtype ", dst.scalar_type(), " is not supported"));
  static const std::pair<const char*, RedOp> kOps[] = {
      {"sum", RedOp::Sum}, {"product", RedOp::Prod}, {"min", RedOp::Min}, {"max", RedOp::Max},
      {"band", RedOp::BAnd}, {"bor", RedOp::BOr}, {"bxor", RedOp::BXor}};
  std::optional<RedOp> rop;
  for (const auto& [n, o] : kOps) {
    if (op == n) rop = o;
  }
  if (!rop) fail(detail::cat("ringreduce ", name, ": unknown op '", op, "'"));
  try {
    const auto n = static_cast<size_t>(dst.numel());
    if (dst.is_cpu()) {
      reduce(dst.data_ptr(), a.data_ptr(), b.data_ptr(), n, *d, *rop);
      return;
    }
#ifdef RINGREDUCE_WITH_CUDA
    if (dst.is_cuda()) {
      c10::cuda::CUDAGuard guard(dst.device());
      cuda::reduce(dst.data_ptr(), a.data_ptr(), b.data_ptr(), n, *d, *rop,
                   c10::cuda::getCurrentCUDAStream(dst.device().index()).stream());
      return;
    }
#endif
  } catch (const std::exception& e) {
    fail(detail::cat("ringreduce ", name, ": ", e.what()));
  }
  fail(detail::cat("ringreduce ", name, ": tensors on ", dst.device(), " are not supported by this build"));
}

RingBackend::RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout), store_(store) {
  StoreBootstrap bs(store);
  try {
    const std::string prefix = incarnation_prefix(bs, size);
    prefix_ = prefix;
    bs.watch(prefix + "setup/failed", size);
    config_ = Config::agree(bs, prefix, rank, size);
    LinkOptions lo;
    lo.mode = config_.transport;
    lo.shm.slot_bytes = config_.slice_bytes;
    lo.shm.nslots = config_.slots;
    lo.shm.spin = config_.spin;
    lo.shm.yield = config_.yield;
    lo.shm.window_bytes = config_.window_bytes;
    lo.tcp.slot_bytes = config_.slice_bytes;
    lo.tcp.nslots = config_.slots;
    lo.tcp.sockets = config_.tcp_sockets;
    lo.tcp.connect_timeout = timeout;
    lo.listen_address = [store] {
      const char* ifname = std::getenv("RINGREDUCE_SOCKET_IFNAME");
      return choose_listen_address(ifname ? ifname : "", store_host(store));
    };
    if (config_.fake_hosts > 0) lo.given_hosts = HostLayout::split(size, config_.fake_hosts);
    links_ = std::make_unique<Links>(bs, prefix, rank, size, lo);
    ring_ = std::make_unique<Ring>(links_->transport(), config_.slice_bytes);
    ring_->set_check_fingerprints(config_.check_fingerprints);
    const HostLayout& hosts = links_->hosts();
    const Selector selector(size, config_.window_bytes, config_.algo, hosts.hosts(), hosts.per_host());
    std::unique_ptr<Hierarchical> hierarchical;
    if (selector.hierarchical()) {
      hierarchical = std::make_unique<Hierarchical>(links_->transport(), hosts, config_.slice_bytes,
                                                    config_.check_fingerprints);
    }
    algo_ = std::make_unique<Collectives>(*ring_, links_->transport().window(), selector,
                                          std::move(hierarchical));
#ifdef RINGREDUCE_WITH_CUDA
    // Nothing is set up on a device until the group's first CUDA op.
    cuda_ = std::make_unique<CudaSide>(store, prefix, rank, size, config_, links_->transport());
#endif
    // Sends and receives get transports of their own, routed as the collectives' are (segments
    // set up now, while every rank is here; pages are only touched by the pairs that use them).
    LinkOptions p2p = lo;
    p2p.shm.window_bytes = 0;  // point-to-point only passes messages
    p2p.shm.doorbells = true;
    p2p.tcp.doorbells = true;
    p2p_links_ = std::make_unique<Links>(bs, prefix + "p2p/", rank, size, p2p, &links_->local());
    p2p_ = std::make_unique<P2p>(p2p_links_->transport(), [](uint8_t code) {
      return std::string(c10::toString(static_cast<at::ScalarType>(code)));
    });
    // The flight recorder's name for this group, the same on every rank, so that a reader can
    // put the dumps of one group together.
    FlightMeta meta;
    if (rank == 0) {
      std::random_device rd;
      char uid[17];
      std::snprintf(uid, sizeof uid, "%08x%08x", rd(), rd());
      bs.set(prefix + "flight/uid", uid);
      meta.group_uid = uid;
    } else {
      meta.group_uid = bs.get(prefix + "flight/uid");
    }
    meta.rank = rank;
    meta.size = size;
    const size_t remote = links_->tcp_peers().size();
    meta.transport = remote == 0 ? "shm" : remote + 1 == static_cast<size_t>(size) ? "tcp" : "mixed";
    flight_ = std::make_unique<FlightRecorder>(meta, flight_capacity_from_env(rank));
    flight_dir_ = FlightRecorder::default_dir();
    // A rank that is not in an op when a peer aborts the group (the rank the others timed out
    // waiting for, typically) dumps too, so that the reader sees every rank's last ops.
    queue_.set_idle([this] {
      if (flight_->dumped()) return;
      const std::string why = links_->transport().abort_reason();
      if (why.empty()) return;
      if (!std::exchange(idle_abort_logged_, true) && log::enabled(log::Level::Warn)) {
        log::write(log::Level::Warn, rank_, "the group was aborted while this rank was in no op: " + why);
      }
      dump_on_failure("the group was aborted while this rank was in no op: " + why);
    });
    if (log::enabled(log::Level::Info)) {
      std::string shm, tcp;
      for (int p = 0; p < size; ++p) {
        if (p == rank) continue;
        std::string& list = links_->local()[p] ? shm : tcp;
        list += detail::cat(list.empty() ? "" : ",", p);
      }
      log::write(log::Level::Info, rank,
                 detail::cat("ringreduce ", RINGREDUCE_VERSION, " (torch ", RINGREDUCE_TORCH_VERSION,
                             ", simd ", simd_level(), "): rank ", rank, " of ", size, ", group ",
                             prefix, " (flight uid ", meta.group_uid, "); peers over shm: ",
                             shm.empty() ? "none" : shm, "; over tcp: ", tcp.empty() ? "none" : tcp,
                             tcp.empty() ? "" : detail::cat(" (listening on ", links_->tcp_address(), ")"),
                             "; ", links_->hosts().describe(), "; algorithms: ", selector.describe(), "; ", config_.to_string()));
    }
  } catch (const c10::Error& e) {
    bs.fail(detail::cat("rank ", rank, " failed: ", e.what_without_backtrace()));
    throw;
  } catch (const std::exception& e) {
    // Every other rank of the group hears of it at once (StoreBootstrap::watch).
    bs.fail(detail::cat("rank ", rank, " failed: ", e.what()));
    fail(detail::cat("ringreduce: rank ", rank, " could not set up the process group",
                     bs.peer_failed() ? " because " : ": ", e.what()));
  }
}

RingBackend::~RingBackend() {
  queue_.set_idle(nullptr);
  queue_.drain();
  if (p2p_) p2p_->shutdown();
}

std::vector<std::string> RingBackend::linked_segments() const {
  auto names = links_->linked_segments();
  for (auto& n : p2p_links_->linked_segments()) names.push_back(n);
#ifdef RINGREDUCE_WITH_CUDA
  for (auto& n : cuda_->linked_segments()) names.push_back(n);
#endif
  return names;
}

std::string RingBackend::cuda_transport() const {
#ifdef RINGREDUCE_WITH_CUDA
  return cuda_->transport_name();
#else
  return "";
#endif
}

std::vector<int> RingBackend::tcp_peers() const { return links_->tcp_peers(); }

std::string RingBackend::dump_flight_recorder(const std::string& dir, const std::string& reason) {
  try {
    return flight_->dump(dir.empty() ? flight_dir_ : dir, reason);
  } catch (const std::exception& e) {
    fail(detail::cat("ringreduce: rank ", rank_, ": ", e.what()));
  }
}

void RingBackend::dump_on_failure(const std::string& reason) {
  // Never lets a dump that fails hide the op's own error: it only says so.
  try {
    const std::string path = flight_->dump_once(flight_dir_, reason);
    if (!path.empty()) {
      std::fprintf(stderr, "[ringreduce] rank %d: flight recorder dumped to %s (%s)\n", rank_,
                   path.c_str(), reason.substr(0, 200).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[ringreduce] rank %d: could not dump the flight recorder: %s\n", rank_,
                 e.what());
  }
}

std::string RingBackend::tcp_address() const { return links_->tcp_address(); }

void RingBackend::setTimeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  timeout_ = timeout;
}

c10::intrusive_ptr<c10d::Backend::Options> RingBackend::getBackendOptions() {
  return c10::make_intrusive<c10d::Backend::Options>("ringreduce", current_timeout());
}

#if !defined(RINGREDUCE_TORCH_MINOR) || RINGREDUCE_TORCH_MINOR >= 208
c10::intrusive_ptr<c10d::Backend> RingBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  for (int r : ranks) {
    if (r < 0 || r >= size_) {
      fail(detail::cat("ringreduce split: rank ", rank_, ": rank ", r,
                       " is not in the parent group (of ", size_, ")"));
    }
  }
  // Numbered in ascending order of their rank here, as torch's split_group registers them.
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  const auto it = std::find(sorted.begin(), sorted.end(), rank_);
  if (it == sorted.end()) return nullptr;
  // `store` is scoped to the new group by torch.
  const std::chrono::milliseconds timeout = opts ? opts->timeout : current_timeout();
  return c10::make_intrusive<RingBackend>(store, static_cast<int>(it - sorted.begin()),
                                          static_cast<int>(ranks.size()), timeout);
}
#endif

std::string RingBackend::algorithm(const std::string& op, int64_t bytes) {
  static const std::pair<const char*, OpKind> kKinds[] = {
      {"allreduce", OpKind::Allreduce},         {"reduce_scatter", OpKind::ReduceScatter},
      {"allgather", OpKind::AllGather},         {"broadcast", OpKind::Broadcast},
      {"reduce", OpKind::Reduce},               {"barrier", OpKind::Barrier},
      {"gather", OpKind::Gather},               {"scatter", OpKind::Scatter},
      {"alltoall", OpKind::AllToAll}};
  if (bytes < 0) fail(detail::cat("ringreduce algorithm: rank ", rank_, ": negative size ", bytes));
  for (const auto& [name, kind] : kKinds) {
    if (op != name) continue;
    if (kind == OpKind::Gather || kind == OpKind::Scatter || kind == OpKind::AllToAll) return "ring";
    std::lock_guard<std::mutex> lock(mu_);
    return algo_name(algo_->algorithm(kind, static_cast<size_t>(bytes)));
  }
  fail(detail::cat("ringreduce algorithm: rank ", rank_, ": unknown collective '", op, "'"));
}

std::string RingBackend::algorithms() const { return algo_->selector().describe(); }

void RingBackend::set_algorithm(const std::string& name) {
  Algo a;
  try {
    a = parse_algo(name, "set_algorithm");
  } catch (const std::exception& e) {
    fail(detail::cat("ringreduce set_algorithm: rank ", rank_, ": ", e.what()));
  }
  // Under mu_ and with the queue idle, so that no op runs or is queued with the old choice.
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.busy()) {
    fail(detail::cat("ringreduce set_algorithm: rank ", rank_, ": ops are in flight; call it ",
                     "between ops, on every rank of the group"));
  }
  algo_->set_selector(algo_->selector().forcing(a));
}

std::chrono::milliseconds RingBackend::current_timeout() {
  std::lock_guard<std::mutex> lock(mu_);
  return timeout_;
}

uint64_t RingBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_;
}

void RingBackend::abort() {  // exit-ok: c10d's name; it ends the group, not the process
  links_->transport().abort_group(detail::cat("rank ", rank_, " aborted the process group"));
#ifdef RINGREDUCE_WITH_CUDA
  cuda_->abort_group(detail::cat("rank ", rank_, " aborted the process group"));
#endif
  queue_.cancel("the process group was aborted");
  p2p_->cancel(detail::cat("rank ", rank_, " aborted the process group"));
}

void RingBackend::shutdown() {
  if (queue_.busy()) {
    // Called with ops in flight (from another thread, or with async ops not waited for): they
    // end now rather than at their deadlines, and the peers' ops with them (a peer waiting for
    // this rank would otherwise wait out its timeout).
    const std::string why = detail::cat("rank ", rank_, " shut the process group down with ops in flight");
    links_->transport().abort_group(why);
#ifdef RINGREDUCE_WITH_CUDA
    cuda_->abort_group(why);
#endif
    queue_.cancel(why);
  } else {
    // Idle: nothing is aborted, so a peer still finishing the last op (whose data this rank has
    // sent already) completes it.
    queue_.drain();
  }
  p2p_->shutdown();
}

c10::intrusive_ptr<c10d::Work> RingBackend::enqueue(c10d::OpType type, const char* name,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs,
                                                    std::chrono::milliseconds timeout,
                                                    bool async_op, Body body) {
  // Where the op runs: on the device of its tensors, which must all be on one.
  std::optional<c10::Device> device;
  for (const std::vector<at::Tensor>* list : {&std::as_const(outputs), &inputs}) {
    for (const at::Tensor& t : *list) {
      if (!t.defined()) continue;
      if (!device) {
        device = t.device();
      } else if (t.device() != *device) {
        fail(detail::cat("ringreduce ", name, ": rank ", rank_, ": the op's tensors are on ",
                         *device, " and ", t.device(), "; they must all be on one device"));
      }
    }
  }
  std::function<void(const OpContext&, const Deadline&)> run;
  const bool on_cuda = device && device->is_cuda();
  if (on_cuda) {
#ifdef RINGREDUCE_WITH_CUDA
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), inputs.begin(), inputs.end());
    run = cuda_->prepare(name, *device, used, std::move(body));
#else
    fail(detail::cat("ringreduce ", name, ": rank ", rank_, ": got a tensor on ", *device,
                     "; this build of ringreduce handles CPU tensors only (", cuda_build_note(), ")"));
#endif
  } else {
    run = [this, body = std::move(body)](const OpContext& ctx, const Deadline& dl) { body(*algo_, ctx, dl); };
  }
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t seq = next_seq_++;
  const std::chrono::milliseconds t = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  if (flight_->capacity() != 0) {
    const std::vector<int64_t>& dims = dims_of(outputs);
    flight_->issued(seq, name, dims.data(), dims.size(),
                    outputs.empty() ? "" : c10::toString(outputs[0].scalar_type()));
  }
  // An async op's caller may replace or grow its tensors' storages before wait(); the op keeps
  // them in place until it ends (a CUDA op's memory is the caching allocator's business).
  std::shared_ptr<StoragePins> pins =
      async_op && !on_cuda ? std::make_shared<StoragePins>(
                                 std::initializer_list<const std::vector<at::Tensor>*>{&outputs, &inputs})
                           : nullptr;
  auto work = c10::make_intrusive<RingWork>(rank_, type, name, seq, std::move(outputs), queue_.state(),
                                            on_cuda ? std::vector<c10::Device>{*device}
                                                    : std::vector<c10::Device>{});
  // A CUDA op's wait() blocks the host until the op is done on the device too (see cuda_side.h).
  // What a TRACE line says of the op, built only when one is written.
  std::string traced;
  if (log::enabled(log::Level::Trace)) {
    const std::vector<at::Tensor> outs = work->result();
    traced = outs.empty() ? detail::cat(name, " #", seq)
                          : detail::cat(name, " #", seq, " ", outs[0].sizes(), " ", outs[0].scalar_type());
    log::write(log::Level::Trace, rank_, detail::cat(traced, ": issued", async_op ? " (async)" : ""));
  }
  std::function<void()> task = [this, run = std::move(run), name, seq, t, pins,
                                traced = std::move(traced)]() mutable {
    OpContext ctx;
    ctx.name = name;
    ctx.seq = seq;
    ctx.timeout = t;
    flight_->started(seq);
    const Clock::time_point began = traced.empty() ? Clock::time_point() : Clock::now();
    // Unpinned when the op ends, before its Work completes: a resize_ after wait() must work.
    struct Unpin {
      std::shared_ptr<StoragePins>& p;
      ~Unpin() { p.reset(); }
    } unpin{pins};
    try {
      // The deadline starts when the op starts: time spent queued behind earlier ops is theirs.
      run(ctx, Deadline::after(t));
    } catch (const std::exception& e) {
      flight_->finished(seq, e.what());
      if (log::enabled(log::Level::Warn)) {
        log::write(log::Level::Warn, rank_, detail::cat(name, " #", seq, " failed: ", e.what()));
      }
      dump_on_failure(detail::cat(name, " #", seq, " failed: ", e.what()));
      throw;
    } catch (...) {
      flight_->finished(seq, "unknown error");
      if (log::enabled(log::Level::Warn)) {
        log::write(log::Level::Warn, rank_, detail::cat(name, " #", seq, " failed"));
      }
      dump_on_failure(detail::cat(name, " #", seq, " failed"));
      throw;
    }
    flight_->finished(seq, "");
    if (!traced.empty()) {
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - began).count();
      log::write(log::Level::Trace, rank_, detail::cat(traced, ": done in ", us, " us"));
    }
  };
  // Claiming or queueing under mu_ keeps queue order equal to sequence order; the op itself
  // runs without mu_, so other threads can issue ops (they queue behind it) meanwhile.
  // (Not for CUDA ops: the caller's thread only queues them, and its stream waits for them.)
  if (!async_op && !on_cuda && queue_.try_claim()) {
    lock.unlock();
    queue_.run_claimed(work, task);
    return work;
  }
  try {
    queue_.push(work, std::move(task));
  } catch (...) {
    --next_seq_;  // never issued: later ops keep the numbers the other ranks give them
    flight_->withdraw(seq);
    throw;
  }
  if (queue_.on_progress_thread()) {
    // Issued by a future callback: run it (after the ops queued before it) before returning, or
    // a callback that waits for its future would wait for its own thread.
    lock.unlock();
    queue_.run_queued_here_until(*work);
  }
  return work;
}

namespace {

// One CPU (or CUDA) tensor, strided, of a dtype ringreduce handles: anything else fails here, at
// the call.
at::Tensor single_tensor(const std::vector<at::Tensor>& tensors, const char* op, int rank) {
  if (tensors.size() != 1) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": expected exactly one tensor, got ",
                     tensors.size(), " (ringreduce runs one device per rank)"));
  }
  const at::Tensor& t = tensors[0];
  if (!t.defined()) fail(detail::cat("ringreduce ", op, ": rank ", rank, ": the tensor is undefined"));
  if (t.layout() != at::kStrided) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", t.layout(),
                     " tensors are not supported, only dense (strided) ones"));
  }
  if (!t.device().is_cpu() && !(kWithCuda && t.device().is_cuda())) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": got a tensor on ", t.device(),
                     "; ringreduce handles CPU", kWithCuda ? " and CUDA" : "", " tensors only",
                     kWithCuda ? "" : detail::cat(" (", cuda_build_note(), ")")));
  }
  return t;
}

DType checked_dtype(const at::Tensor& t, const char* op, int rank) {
  const auto d = core_dtype(t.scalar_type());
  if (!d) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": dtype ", t.scalar_type(),
                     " is not supported (supported: float32, float64, float16, bfloat16, int8, "
                     "uint8, int16, int32, int64, bool, complex64, complex128)"));
  }
  return *d;
}

Reduction checked_reduction(const c10d::ReduceOp& rop, DType d, const char* op, int rank, int size) {
  Reduction r;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = RedOp::Sum; break;
    case c10d::ReduceOp::PRODUCT: r.op = RedOp::Prod; break;
    case c10d::ReduceOp::MIN: r.op = RedOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = RedOp::Max; break;
    case c10d::ReduceOp::BAND: r.op = RedOp::BAnd; break;
    case c10d::ReduceOp::BOR: r.op = RedOp::BOr; break;
    case c10d::ReduceOp::BXOR: r.op = RedOp::BXor; break;
    case c10d::ReduceOp::AVG:
      if (d == DType::Bool) {
        fail(detail::cat("ringreduce ", op, ": rank ", rank, ": AVG is not defined on bool tensors"));
      }
      r.divisor = size;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!is_floating(d) && !is_complex(d)) {
        fail(detail::cat("ringreduce ", op, ": rank ", rank, ": PREMUL_SUM needs a floating-point ",
                         "or complex tensor, got ", dtype_name(d)));
      }
      // NCCLPreMulSumSupplement: the name both torch 2.11 and 2.13 have (2.13 calls it PreMulSumSupplement too).
      const auto* supp = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      if (supp == nullptr) {
        fail(detail::cat("ringreduce ", op, ": rank ", rank,
                         ": PREMUL_SUM without a factor (make it with _make_nccl_premul_sum)"));
      }
      if (supp->tensor_factor.defined()) {
        if (supp->tensor_factor.numel() != 1) {
          fail(detail::cat("ringreduce ", op, ": rank ", rank, ": PREMUL_SUM's factor tensor has ",
                           supp->tensor_factor.numel(), " elements, expected 1"));
        }
        r.premul = supp->tensor_factor.to(at::kCPU).item<double>();
      } else {
        r.premul = supp->double_factor;
      }
      break;
    }
    default:
      fail(detail::cat("ringreduce ", op, ": rank ", rank, ": reduce op ", static_cast<int>(rop.op_),
                       " is not supported"));
  }
  if (const char* why = unsupported_reason(d, r.op)) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", redop_name(r.op), " on ",
                     dtype_name(d), ": ", why));
  }
  return r;
}

// A tensor the op may write for the caller's `t`: t itself when it is contiguous and clear of
// `input`, else a private buffer (owned by the op) copied into t only on success.
at::Tensor writable(const at::Tensor& t, const at::Tensor& input) {
  if (t.is_contiguous() && at::get_overlap_status(t, input) == at::MemOverlapStatus::No) return t;
  return at::empty(t.sizes(), t.options());
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, int rank,
                      const char* what) {
  if (a.scalar_type() != b.scalar_type()) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", what, " has dtype ", a.scalar_type(),
                     ", expected ", b.scalar_type(), " like the input"));
  }
}

// A list that must hold exactly `n` tensors shaped like `like` (CPU, same dtype and element count).
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int n, const char* op,
                int rank, const char* what) {
  if (static_cast<int>(list.size()) != n) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": the ", what, " list has ", list.size(),
                     " tensors, expected one per rank (", n, ")"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    single_tensor({list[i]}, op, rank);
    check_same_dtype(list[i], like, op, rank, what);
    if (list[i].numel() != like.numel()) {
      fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", what, " tensor ", i, " has ",
                       list[i].numel(), " elements, expected ", like.numel()));
    }
  }
}

// Ops that only move bytes take any dtype: types the kernels do not know travel as bytes. Returns
// the tag to move `t` as, and how many of those elements one of t's elements is.
std::pair<DType, size_t> moved_as(const at::Tensor& t) {
  const auto known = core_dtype(t.scalar_type());
  if (known) return {*known, 1};
  return {DType::UInt8, t.element_size()};
}

std::pair<DType, size_t> as_moved(const at::Tensor& t) {
  const auto [d, scale] = moved_as(t);
  return {d, static_cast<size_t>(t.numel()) * scale};
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce(std::vector<at::Tensor>& tensors_arg,
                                                      const c10d::AllreduceOptions& opts) {
  if (tensors_arg.size() == 1 && tensors_arg[0].defined() && tensors_arg[0].is_sparse()) {
    // The result replaces the caller's tensor's indices and values: its own TensorImpl, not held.
    const at::Tensor& t = tensors_arg[0];
    return enqueue(c10d::OpType::ALLREDUCE, "allreduce", {t}, {}, opts.timeout, opts.asyncOp,
                   sparse_allreduce_body(t, opts.reduceOp, rank_, size_));
  }
  const auto tensors = held(tensors_arg, opts.asyncOp);
  at::Tensor t = single_tensor(tensors, "allreduce", rank_);
  return enqueue(c10d::OpType::ALLREDUCE, "allreduce", {t}, {}, opts.timeout, opts.asyncOp,
                 allreduce_body(t, opts.reduceOp));
}

RingBackend::Body RingBackend::allreduce_body(const at::Tensor& t, const c10d::ReduceOp& rop) {
  const char* name = "allreduce";
  single_tensor({t}, name, rank_);
  const DType d = checked_dtype(t, name, rank_);
  const Reduction red = checked_reduction(rop, d, name, rank_, size_);

  at::NoGradGuard no_grad;
  // The ring works on contiguous memory. For a strided tensor it works on a private copy (owned
  // by this op) and writes the result back only on success, so a failure leaves the caller's
  // tensor as it was.
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  // PREMUL_SUM scales this rank's contribution before the sum, into a tensor owned by the op.
  at::Tensor in = red.premul ? buf.mul(*red.premul) : buf;
  return [this, t, buf, in, d, red](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.allreduce(in.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), d, red.op,
                     red.divisor, ctx, dl);
    if (!buf.is_same(t)) t.copy_(buf);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::_reduce_scatter_base(
    at::Tensor& output_arg, at::Tensor& input_arg, const c10d::ReduceScatterOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", {output}, {input}, opts.timeout,
                 opts.asyncOp, reduce_scatter_body(output, input, opts.reduceOp));
}

RingBackend::Body RingBackend::reduce_scatter_body(const at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& rop) {
  const char* name = "reduce_scatter";
  single_tensor({output}, name, rank_);
  single_tensor({input}, name, rank_);
  check_same_dtype(output, input, name, rank_, "the output");
  const DType d = checked_dtype(input, name, rank_);
  const Reduction red = checked_reduction(rop, d, name, rank_, size_);
  if (input.numel() != output.numel() * size_) {
    fail(detail::cat("ringreduce reduce_scatter: rank ", rank_, ": the input has ", input.numel(),
                     " elements, expected world size (", size_, ") x the output's ", output.numel()));
  }
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  if (red.premul) in = in.mul(*red.premul);  // this rank's contribution, scaled, owned by the op
  at::Tensor out = writable(output, in);
  const size_t count = static_cast<size_t>(output.numel());
  return [this, output, in, out, d, red, count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.reduce_scatter(Chunks(in.data_ptr(), count * in.element_size()), out.data_ptr(), count,
                          d, red.op, red.divisor, ctx, dl);
    if (!out.is_same(output)) output.copy_(out);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs_arg, std::vector<std::vector<at::Tensor>>& inputs_arg,
    const c10d::ReduceScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "reduce_scatter";
  at::Tensor output = single_tensor(outputs, name, rank_);
  if (inputs.size() != 1) {
    fail(detail::cat("ringreduce reduce_scatter: rank ", rank_, ": expected one input list, got ",
                     inputs.size()));
  }
  check_list(inputs[0], output, size_, name, rank_, "input");
  const DType d = checked_dtype(output, name, rank_);
  const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> in;  // contiguous (or scaled) copies where needed, owned by the op
  for (const at::Tensor& t : inputs[0]) in.push_back(red.premul ? t.mul(*red.premul) : t.contiguous());
  at::Tensor out = output;
  for (const at::Tensor& t : in) {
    if (!output.is_contiguous() || at::get_overlap_status(output, t) != at::MemOverlapStatus::No) {
      out = at::empty(output.sizes(), output.options());
      break;
    }
  }
  const size_t count = static_cast<size_t>(output.numel());
  return enqueue(c10d::OpType::REDUCE_SCATTER, name, {output}, inputs[0], opts.timeout, opts.asyncOp,
                 [this, output, in, out, d, red, count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   std::vector<void*> ptrs;
                   for (const at::Tensor& t : in) ptrs.push_back(t.data_ptr());
                   algo.reduce_scatter(Chunks(&ptrs), out.data_ptr(), count, d, red.op,
                                         red.divisor, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_allgather_base(at::Tensor& output_arg, at::Tensor& input_arg,
                                                            const c10d::AllgatherOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "allgather", {output}, {input}, opts.timeout, opts.asyncOp,
                 allgather_body(output, input));
}

RingBackend::Body RingBackend::allgather_body(const at::Tensor& output, const at::Tensor& input) {
  const char* name = "allgather";
  single_tensor({output}, name, rank_);
  single_tensor({input}, name, rank_);
  check_same_dtype(output, input, name, rank_, "the output");
  if (output.numel() != input.numel() * size_) {
    fail(detail::cat("ringreduce allgather: rank ", rank_, ": the output has ", output.numel(),
                     " elements, expected world size (", size_, ") x the input's ", input.numel()));
  }
  const auto [d, count] = as_moved(input);  // all-gather only moves bytes: any dtype
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  // The input may be the output's own chunk (all_gather_into_tensor on a view): the ring then
  // skips the copy; any other overlap goes through a private buffer.
  at::Tensor out = output;
  if (!output.is_contiguous()) {
    out = at::empty(output.sizes(), output.options());
  } else if (at::get_overlap_status(output, in) != at::MemOverlapStatus::No) {
    const auto* mine = static_cast<const uint8_t*>(output.data_ptr()) + rank_ * in.nbytes();
    if (mine != in.data_ptr()) out = at::empty(output.sizes(), output.options());
  }
  return [this, output, in, out, d = d, count = count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.all_gather(in.data_ptr(), Chunks(out.data_ptr(), in.nbytes()), count, d, ctx, dl);
    if (!out.is_same(output)) output.copy_(out);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs_arg,
                                                      std::vector<at::Tensor>& inputs_arg,
                                                      const c10d::AllgatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  at::Tensor input = single_tensor(inputs, "allgather", rank_);
  if (outputs.size() != 1) {
    fail(detail::cat("ringreduce allgather: rank ", rank_, ": expected one output list, got ",
                     outputs.size()));
  }
  return enqueue(c10d::OpType::ALLGATHER, "allgather", outputs[0], {input}, opts.timeout, opts.asyncOp,
                 allgather_list_body(outputs[0], input));
}

RingBackend::Body RingBackend::allgather_list_body(const std::vector<at::Tensor>& outputs,
                                                   const at::Tensor& input) {
  const char* name = "allgather";
  check_list(outputs, input, size_, name, rank_, "output");
  const auto [d, count] = as_moved(input);
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  std::vector<at::Tensor> user = outputs;
  std::vector<at::Tensor> out;  // the caller's tensors where the ring can write them directly
  for (const at::Tensor& t : user) {
    const bool direct = t.is_contiguous() && at::get_overlap_status(t, in) == at::MemOverlapStatus::No;
    out.push_back(direct ? t : at::empty(t.sizes(), t.options()));
  }
  return [this, user, in, out, d = d, count = count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    std::vector<void*> ptrs;
    for (const at::Tensor& t : out) ptrs.push_back(t.data_ptr());
    algo.all_gather(in.data_ptr(), Chunks(&ptrs), count, d, ctx, dl);
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].is_same(user[i])) user[i].copy_(out[i]);
    }
  };
}

int RingBackend::checked_root(int64_t root, const char* op) const {
  if (root < 0 || root >= size_) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank_, ": root ", root,
                     " is not a rank of this group (size ", size_, ")"));
  }
  return static_cast<int>(root);
}

namespace {

// The caller's tensors, or private contiguous buffers (owned by the op, copied back on success)
// where a caller's tensor is strided.
std::vector<at::Tensor> writable_list(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(t.is_contiguous() ? t : at::empty(t.sizes(), t.options()));
  return out;
}

void copy_back(const std::vector<at::Tensor>& bufs, const std::vector<at::Tensor>& user) {
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (!bufs[i].is_same(user[i])) user[i].copy_(bufs[i]);
  }
}

std::vector<void*> pointers(const std::vector<at::Tensor>& ts) {
  std::vector<void*> p;
  for (const at::Tensor& t : ts) p.push_back(t.data_ptr());
  return p;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::reduce(std::vector<at::Tensor>& tensors_arg,
                                                   const c10d::ReduceOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  const char* name = "reduce";
  at::Tensor t = single_tensor(tensors, name, rank_);
  const int root = checked_root(opts.rootRank, name);
  const DType d = checked_dtype(t, name, rank_);
  const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
  at::NoGradGuard no_grad;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  at::Tensor in = red.premul ? buf.mul(*red.premul) : buf;
  // Only the root's tensor is written; the others keep their values, as with torch's backends.
  return enqueue(c10d::OpType::REDUCE, name, {t}, {}, opts.timeout, opts.asyncOp,
                 [this, t, buf, in, d, red, root](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   algo.reduce(in.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), d,
                                 red.op, red.divisor, root, ctx, dl);
                   if (rank_ == root && !buf.is_same(t)) t.copy_(buf);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs_arg,
                                                   std::vector<at::Tensor>& inputs_arg,
                                                   const c10d::GatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "gather";
  at::Tensor input = single_tensor(inputs, name, rank_);
  const int root = checked_root(opts.rootRank, name);
  std::vector<at::Tensor> user;
  if (rank_ == root) {
    if (outputs.size() != 1) {
      fail(detail::cat("ringreduce gather: rank ", rank_, " (the root): expected one output list, got ",
                       outputs.size()));
    }
    check_list(outputs[0], input, size_, name, rank_, "output");
    user = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(detail::cat("ringreduce gather: rank ", rank_, ": only the root (", root,
                     ") takes an output list"));
  }
  const auto [d, count] = as_moved(input);
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  std::vector<at::Tensor> bufs = writable_list(user);
  return enqueue(c10d::OpType::GATHER, name, user, {input}, opts.timeout, opts.asyncOp,
                 [this, in, user, bufs, d = d, count = count, root](Collectives& algo, const OpContext& ctx,
                                                                    const Deadline& dl) {
                   std::vector<void*> ptrs = pointers(bufs);
                   algo.gather(in.data_ptr(), Chunks(&ptrs), count, d, root, ctx, dl);
                   copy_back(bufs, user);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::scatter(std::vector<at::Tensor>& outputs_arg,
                                                    std::vector<std::vector<at::Tensor>>& inputs_arg,
                                                    const c10d::ScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "scatter";
  at::Tensor output = single_tensor(outputs, name, rank_);
  const int root = checked_root(opts.rootRank, name);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    if (inputs.size() != 1) {
      fail(detail::cat("ringreduce scatter: rank ", rank_, " (the root): expected one input list, got ",
                       inputs.size()));
    }
    check_list(inputs[0], output, size_, name, rank_, "input");
    for (const at::Tensor& t : inputs[0]) ins.push_back(t.contiguous());
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(detail::cat("ringreduce scatter: rank ", rank_, ": only the root (", root,
                     ") takes an input list"));
  }
  const auto [d, count] = as_moved(output);
  at::NoGradGuard no_grad;
  at::Tensor out = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
  return enqueue(c10d::OpType::SCATTER, name, {output}, ins, opts.timeout, opts.asyncOp,
                 [this, ins, output, out, d = d, count = count, root](Collectives& algo, const OpContext& ctx,
                                                                      const Deadline& dl) {
                   std::vector<void*> ptrs = pointers(ins);
                   algo.scatter(Chunks(&ptrs), out.data_ptr(), count, d, root, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall_base(at::Tensor& output_arg, at::Tensor& input_arg,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  const char* name = "alltoall";
  single_tensor({output}, name, rank_);
  single_tensor({input}, name, rank_);
  check_same_dtype(output, input, name, rank_, "the output");
  // Splits count rows (the first dimension); none means equal parts.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const int64_t row_elems = rows > 0 ? t.numel() / rows : 0;
    std::vector<size_t> c(size_);
    if (splits.empty()) {
      if (rows % size_ != 0) {
        fail(detail::cat("ringreduce alltoall: rank ", rank_, ": the ", what, "'s first dimension (",
                         rows, ") does not divide by the world size (", size_, ")"));
      }
      for (auto& x : c) x = static_cast<size_t>(rows / size_ * row_elems);
      return c;
    }
    int64_t total = 0;
    for (int64_t v : splits) total += v;
    if (static_cast<int>(splits.size()) != size_ || total != rows ||
        std::any_of(splits.begin(), splits.end(), [](int64_t v) { return v < 0; })) {
      fail(detail::cat("ringreduce alltoall: rank ", rank_, ": ", what, " split sizes must be ",
                       size_, " non-negative numbers adding up to the first dimension (", rows, ")"));
    }
    for (int p = 0; p < size_; ++p) c[p] = static_cast<size_t>(splits[p] * row_elems);
    return c;
  };
  std::vector<size_t> send = counts(input, input_split_sizes, "input");
  std::vector<size_t> recv = counts(output, output_split_sizes, "output");
  const auto [d, elem_scale] = moved_as(input);
  for (auto& x : send) x *= elem_scale;
  for (auto& x : recv) x *= elem_scale;
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  at::Tensor out = writable(output, in);
  return enqueue(c10d::OpType::ALLTOALL_BASE, name, {output}, {input}, opts.timeout, opts.asyncOp,
                 [this, in, output, out, send, recv, d = d](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   const size_t es = dtype_size(d);
                   std::vector<void*> ip, op;
                   auto* ib = static_cast<uint8_t*>(in.data_ptr());
                   auto* ob = static_cast<uint8_t*>(out.data_ptr());
                   for (int p = 0; p < size_; ++p) {
                     ip.push_back(ib);
                     op.push_back(ob);
                     ib += send[p] * es;
                     ob += recv[p] * es;
                   }
                   algo.alltoall(Chunks(&ip), send, Chunks(&op), recv, d, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall(std::vector<at::Tensor>& outputs_arg,
                                                     std::vector<at::Tensor>& inputs_arg,
                                                     const c10d::AllToAllOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "alltoall";
  if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
    fail(detail::cat("ringreduce alltoall: rank ", rank_, ": expected ", size_,
                     " input and output tensors, got ", inputs.size(), " and ", outputs.size()));
  }
  for (int p = 0; p < size_; ++p) {
    single_tensor({outputs[p]}, name, rank_);
    single_tensor({inputs[p]}, name, rank_);
    check_same_dtype(outputs[p], inputs[0], name, rank_, "an output");
    check_same_dtype(inputs[p], inputs[0], name, rank_, "an input");
  }
  const auto [d, scale] = moved_as(inputs[0]);
  std::vector<size_t> send, recv;
  for (int p = 0; p < size_; ++p) {
    send.push_back(static_cast<size_t>(inputs[p].numel()) * scale);
    recv.push_back(static_cast<size_t>(outputs[p].numel()) * scale);
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> ins;
  for (const at::Tensor& t : inputs) ins.push_back(t.contiguous());
  std::vector<at::Tensor> user = outputs;
  std::vector<at::Tensor> bufs;
  for (const at::Tensor& t : user) {
    bool clear = t.is_contiguous();
    for (const at::Tensor& i : ins) clear = clear && at::get_overlap_status(t, i) == at::MemOverlapStatus::No;
    bufs.push_back(clear ? t : at::empty(t.sizes(), t.options()));
  }
  return enqueue(c10d::OpType::ALLTOALL, name, user, inputs, opts.timeout, opts.asyncOp,
                 [this, ins, user, bufs, send, recv, d = d](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   std::vector<void*> ip = pointers(ins), op = pointers(bufs);
                   algo.alltoall(Chunks(&ip), send, Chunks(&op), recv, d, ctx, dl);
                   copy_back(bufs, user);
                 });
}

namespace {

// The coalesced forms: one Work whose op runs the parts in order, each checked at the call.
RingBackend::Body in_order(std::vector<RingBackend::Body> parts) {
  return [parts = std::move(parts)](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    for (const auto& part : parts) part(algo, ctx, dl);
  };
}

void check_pairs(size_t outputs, size_t inputs, const char* op, int rank) {
  if (outputs != inputs) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", outputs, " outputs for ", inputs,
                     " inputs"));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors_arg, const c10d::AllreduceCoalescedOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  std::vector<Body> parts;
  for (const at::Tensor& t : tensors) parts.push_back(allreduce_body(t, opts.reduceOp));
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", tensors, {}, opts.timeout,
                 opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::AllgatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  check_pairs(outputs.size(), inputs.size(), "allgather_into_tensor_coalesced", rank_);
  std::vector<Body> parts;
  for (size_t i = 0; i < outputs.size(); ++i) parts.push_back(allgather_body(outputs[i], inputs[i]));
  return enqueue(c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", outputs, inputs, opts.timeout,
                 opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::ReduceScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  check_pairs(outputs.size(), inputs.size(), "reduce_scatter_tensor_coalesced", rank_);
  std::vector<Body> parts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    parts.push_back(reduce_scatter_body(outputs[i], inputs[i], opts.reduceOp));
  }
  return enqueue(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", outputs, inputs, opts.timeout,
                 opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::AllgatherOptions& opts) {
  const auto output_lists = held(output_lists_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  // torch's layout (dist.all_gather_coalesced, as gloo reads it): one list per rank, each with
  // one tensor per input; output_lists[r][i] receives rank r's input i.
  const char* name = "allgather_coalesced";
  if (output_lists.size() != static_cast<size_t>(size_)) {
    fail(detail::cat("ringreduce ", name, ": rank ", rank_, ": expected one output list per rank (",
                     size_, "), got ", output_lists.size()));
  }
  for (size_t r = 0; r < output_lists.size(); ++r) {
    if (output_lists[r].size() != inputs.size()) {
      fail(detail::cat("ringreduce ", name, ": rank ", rank_, ": output list ", r, " has ",
                       output_lists[r].size(), " tensors for ", inputs.size(), " inputs"));
    }
  }
  std::vector<Body> parts;
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> gathered;  // input i of every rank
    for (const std::vector<at::Tensor>& list : output_lists) gathered.push_back(list[i]);
    parts.push_back(allgather_list_body(gathered, inputs[i]));
  }
  for (const std::vector<at::Tensor>& list : output_lists) {
    outputs.insert(outputs.end(), list.begin(), list.end());
  }
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced", outputs, inputs, opts.timeout,
                 opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::broadcast(std::vector<at::Tensor>& tensors_arg,
                                                      const c10d::BroadcastOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  const char* name = "broadcast";
  at::Tensor t = single_tensor(tensors, name, rank_);
  const int root = checked_root(opts.rootRank, name);
  if (opts.rootTensor != 0) {
    fail(detail::cat("ringreduce broadcast: rank ", rank_, ": root tensor ", opts.rootTensor,
                     " does not exist: one tensor per rank"));
  }
  const auto [d, count] = as_moved(t);  // broadcast only moves bytes: any dtype

  at::NoGradGuard no_grad;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  return enqueue(c10d::OpType::BROADCAST, name, {t}, {}, opts.timeout, opts.asyncOp,
                 [this, t, buf, d = d, count = count, root](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   algo.broadcast(buf.data_ptr(), count, d, root, ctx, dl);
                   if (!buf.is_same(t) && rank_ != root) t.copy_(buf);
                 });
}

void RingBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const std::chrono::milliseconds t = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  monitored_barrier(*store_, detail::cat(prefix_, "monitored_barrier/", monitored_barriers_++, "/"),
                    rank_, size_, t, waitAllRanks);
}

c10::intrusive_ptr<c10d::Work> RingBackend::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(c10d::OpType::BARRIER, "barrier", {}, {}, opts.timeout, opts.asyncOp,
                 [this](Collectives& algo, const OpContext& ctx, const Deadline& dl) { algo.barrier(ctx, dl); });
}

}  // namespace ringreduce

namespace ringreduce {

namespace {

// The p2p engine's completion: copy a strided receive back, name the source, complete the Work.
// `pins` keeps the storages the engine writes or reads in place until then (see StoragePins).
P2p::Done p2p_done(c10::intrusive_ptr<RingWork> work, at::Tensor user, at::Tensor buf) {
  const std::vector<at::Tensor> used{user, buf};
  auto pins = std::make_shared<StoragePins>(std::initializer_list<const std::vector<at::Tensor>*>{&used});
  return [work = std::move(work), user = std::move(user), buf = std::move(buf), pins](
             std::exception_ptr error, int source) mutable {
    if (!error && !user.is_same(buf)) {
      try {
        at::NoGradGuard no_grad;
        // A CUDA tensor's data came through host memory: copied to its device here, and
        // synchronously, so that the Work completes with it in place.
        c10::OptionalDeviceGuard on_device(user.device());
        user.copy_(buf);
      } catch (...) {
        error = std::current_exception();
      }
    }
    pins.reset();
    work->set_source_rank(source);
    work->complete(error ? as_dist_error(error) : nullptr);
  };
}

void check_peer(int peer, int rank, int size, const char* op, const char* what) {
  if (peer < 0 || peer >= size) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": invalid ", what, " rank ", peer,
                     " (group of ", size, ")"));
  }
  if (peer == rank) {
    fail(detail::cat("ringreduce ", op, ": rank ", rank, ": ", what, " rank ", peer,
                     " is this rank itself"));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                 int tag) {
  const char* name = "send";
  const at::Tensor& t = single_tensor(tensors, name, rank_);
  check_peer(dstRank, rank_, size_, name, "destination");
  // A strided tensor travels from a private contiguous copy, taken now; a CUDA tensor through
  // host memory (point-to-point messages run on the host transport), copied now, once the
  // caller's stream has produced it.
  at::Tensor buf = t.is_cuda() ? t.to(at::kCPU) : t.is_contiguous() ? t : t.contiguous();
  auto work = c10::make_intrusive<RingWork>(rank_, c10d::OpType::SEND, name, next_p2p_seq_++,
                                            std::vector<at::Tensor>{t}, queue_.state());
  try {
    p2p_->send(buf.data_ptr(), buf.nbytes(), static_cast<uint8_t>(t.scalar_type()), dstRank, tag,
               current_timeout(), p2p_done(work, buf, buf));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::p2p_recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag, const char* name) {
  const at::Tensor& t = single_tensor(tensors, name, rank_);
  if (src != -1) check_peer(src, rank_, size_, name, "source");
  // Data lands straight in a contiguous CPU tensor; a strided or CUDA one gets it on success only.
  at::Tensor buf = t.is_cuda() ? at::empty(t.sizes(), t.options().device(at::kCPU))
                   : t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  auto work = c10::make_intrusive<RingWork>(rank_, c10d::OpType::RECV, name, next_p2p_seq_++,
                                            std::vector<at::Tensor>{t}, queue_.state());
  try {
    p2p_->recv(buf.data_ptr(), buf.nbytes(), static_cast<uint8_t>(t.scalar_type()), src, tag,
               current_timeout(), p2p_done(work, t, buf));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                 int tag) {
  return p2p_recv(tensors, srcRank, tag, "recv");
}

c10::intrusive_ptr<c10d::Work> RingBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  return p2p_recv(tensors, -1, tag, "recvAnysource");
}

}  // namespace ringreduce

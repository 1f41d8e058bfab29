// RingBackend's life: construction (the store bootstrap, the transports, the algorithms, the
// flight recorder), what it reports of its set-up, the algorithm knobs, abort, shutdown and
// destruction.
#include "backend/ring_backend.h"

#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>

#include "backend/store_bootstrap.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "p2p/p2p.h"
#include "reduce/reduce.h"
#include "algo/collectives.h"
#include "algo/messages.h"
#include "transport/links.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/address.h"
#include "transport/tcp/tcp_transport.h"

namespace ringreduce {

namespace {

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

}  // namespace

RingBackend::RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout), store_(store) {
  StoreBootstrap bs(store);
  try {
    failpoint("setup.start", rank);
    const std::string prefix = incarnation_prefix(bs, rank, size, timeout);
    prefix_ = prefix;
    bs.watch(prefix + "setup/failed", size);
    config_ = Config::agree(bs, prefix, rank, size);
    failpoint("setup.agreed", rank);
    LinkOptions lo;
    lo.mode = config_.transport;
    lo.shm.slot_bytes = config_.slice_bytes;
    lo.shm.nslots = config_.slots;
    lo.shm.spin = config_.spin;
    lo.shm.spin_max = config_.spin_max;
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
    failpoint("setup.links", rank);
    msgs_ = std::make_unique<Messages>(links_->transport(), config_.slice_bytes);
    msgs_->set_check_fingerprints(config_.check_fingerprints);
    msgs_->slot_writes().configure(config_.stream, config_.stream_bytes, rank);
    const HostLayout& hosts = links_->hosts();
    // The selector is told what the transport offers (no window over TCP, or across hosts), so
    // that every choice, and what `algorithms` reports, is made there.
    PeerWindow* window = links_->transport().window();
    const Selector selector(size, window != nullptr ? config_.window_bytes : 0, config_.algo,
                            hosts.hosts(), hosts.per_host());
    std::unique_ptr<Hierarchical> hierarchical;
    if (selector.hierarchical()) {
      hierarchical = std::make_unique<Hierarchical>(links_->transport(), hosts, config_.slice_bytes,
                                                    config_.check_fingerprints);
      hierarchical->host_slot_writes().configure(config_.stream, config_.stream_bytes, rank);
    }
    algo_ = std::make_unique<Collectives>(*msgs_, window, selector,
                                          std::move(hierarchical));
    algo_->window_writes().configure(config_.stream, config_.stream_bytes, rank);
#ifdef RINGREDUCE_WITH_CUDA
    // Nothing is set up on a device until the group's first CUDA op.
    cuda_ = std::make_unique<CudaSide>(store, prefix, rank, size, config_, links_->transport(),
                                       [this](uint64_t seq, const std::string& error) {
                                         flight_->finished(seq, error, Clock::now());
                                         if (!error.empty()) {
                                           if (log::enabled(log::Level::Warn)) log::write(log::Level::Warn, rank_, error);
                                           dump_on_failure(error);
                                         }
                                       });
#endif
    // Sends and receives get transports of their own, routed as the collectives' are (segments
    // set up now, while every rank is here; pages are only touched by the pairs that use them).
    LinkOptions p2p = lo;
    p2p.shm.window_bytes = 0;  // point-to-point only passes messages
    p2p.shm.doorbells = true;
    p2p.tcp.doorbells = true;
    p2p_links_ = std::make_unique<Links>(bs, prefix + "p2p/", rank, size, p2p, &links_->routes());
    failpoint("setup.p2p_links", rank);
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
    meta.transport = links_->carried_by();
    flight_ = std::make_unique<FlightRecorder>(meta, flight_capacity_from_env(rank));
    flight_dir_ = FlightRecorder::default_dir();
    // A rank that is not in an op when a peer aborts the group (the rank the others timed out
    // waiting for, typically) dumps too, so that the reader sees every rank's last ops.
    queue_.set_start_delay(config_.async_start);
    queue_.set_idle([this] {
      if (flight_->dumped()) return;
      const std::string why = links_->transport().control().abort_reason();
      if (why.empty()) return;
      if (!std::exchange(idle_abort_logged_, true) && log::enabled(log::Level::Warn)) {
        log::write(log::Level::Warn, rank_, "the group was aborted while this rank was in no op: " + why);
      }
      dump_on_failure("the group was aborted while this rank was in no op: " + why);
    });
    if (log::enabled(log::Level::Info)) {
      log::write(log::Level::Info, rank,
                 detail::cat("ringreduce ", RINGREDUCE_VERSION, " (torch ", RINGREDUCE_TORCH_VERSION,
                             ", simd ", simd_level(), "): rank ", rank, " of ", size, ", group ",
                             prefix, " (flight uid ", meta.group_uid, "); ", links_->describe(),
                             "; ", links_->hosts().describe(), "; algorithms: ", selector.describe(), "; slot writes: ",
                             msgs_->slot_writes().describe(), "; defaults for ", config_.local_ranks_seen,
                             " ranks on rank 0's machine; ", config_.to_string()));
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
#ifdef RINGREDUCE_WITH_CUDA
  // Before the flight recorder (a later member, so destroyed first) goes: the stream-ordered ops'
  // watchdog records each op's end there until the last one has ended.
  cuda_.reset();
#endif
  if (p2p_) p2p_->shutdown();
}

namespace {

const ShmTransport* shm_of(const Links& l) { return static_cast<const ShmTransport*>(l.row("shm")); }

}  // namespace

std::vector<std::string> RingBackend::linked_segments() const {
  std::vector<std::string> names;
  for (const Links* l : {links_.get(), p2p_links_.get()}) {
    if (const ShmTransport* shm = shm_of(*l)) {
      for (auto& n : shm->linked_segments()) names.push_back(n);
    }
  }
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

std::vector<int> RingBackend::tcp_peers() const { return links_->peers_over("tcp"); }

std::string RingBackend::segments() const {
  const ShmTransport* shm = shm_of(*links_);
  return shm == nullptr ? "none" : shm->anonymous() ? "memfd" : "/dev/shm";
}

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
      // The whole reason is in the dump and in the error the op raises: a long one is cut here at
      // a word, and says so.
      std::string shown = reason;
      if (shown.size() > 200) {
        const size_t cut = shown.rfind(' ', 200);
        shown = shown.substr(0, cut == std::string::npos || cut < 100 ? 200 : cut) + " ...";
      }
      log::note(rank_, detail::cat("flight recorder dumped to ", path, " (", shown, ")"));
    }
  } catch (const std::exception& e) {
    log::note(rank_, detail::cat("could not dump the flight recorder: ", e.what()));
  }
}

std::string RingBackend::tcp_address() const {
  const auto* tcp = static_cast<const TcpTransport*>(links_->row("tcp"));
  return tcp ? tcp->address() : std::string();
}

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
      fail(detail::cat(op_prefix("split", rank_), "rank ", r,
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
  if (bytes < 0) fail(detail::cat(op_prefix("algorithm", rank_), "negative size ", bytes));
  for (const auto& [name, kind] : kKinds) {
    if (op != name) continue;
    if (kind == OpKind::Gather || kind == OpKind::Scatter || kind == OpKind::AllToAll) return "ring";
    std::lock_guard<std::mutex> lock(mu_);
    return algo_name(algo_->algorithm(kind, static_cast<size_t>(bytes)));
  }
  fail(detail::cat(op_prefix("algorithm", rank_), "unknown collective '", op, "'"));
}

std::string RingBackend::algorithms() const { return algo_->selector().describe(); }

void RingBackend::set_algorithm(const std::string& name) {
  Algo a;
  try {
    a = parse_algo(name, "set_algorithm");
  } catch (const std::exception& e) {
    fail(detail::cat(op_prefix("set_algorithm", rank_), e.what()));
  }
  // Under mu_ and with the queue idle, so that no op runs or is queued with the old choice.
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.busy()) {
    fail(detail::cat(op_prefix("set_algorithm", rank_), "ops are in flight; call it ",
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
  links_->transport().control().abort_group(detail::cat("rank ", rank_, " aborted the process group"));
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
    links_->transport().control().abort_group(why);
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

}  // namespace ringreduce

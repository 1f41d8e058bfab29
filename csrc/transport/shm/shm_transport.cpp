#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>

#include "common/error.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/machine.h"
#include "transport/shm/fd_passing.h"
#include "transport/shm/host.h"
#include "transport/shm/shm_internal.h"

namespace ringreduce {

using shm::create_memfd;
using shm::kMagic;
using shm::kPage;
using shm::kReasonBytes;
using shm::kSlotHeaderBytes;
using shm::round_up;
using shm::mount_namespace;
using shm::net_namespace;
using shm::pid_namespace;
using shm::process_gone;
using shm::process_state;
using shm::sweep_stale_segments;

namespace {


std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

uint64_t random_token() {
  std::random_device rd;  // /dev/urandom: the name must not be guessable by other users
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// MiB with one decimal, for messages about /dev/shm.
std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
  return buf;
}

}  // namespace

std::string ShmTransport::no_room_message(int rank, int size, int err) const {
  struct statvfs fs;
  const bool known = statvfs("/dev/shm", &fs) == 0;
  const double total = known ? static_cast<double>(fs.f_blocks) * fs.f_frsize : 0;
  const double avail = known ? static_cast<double>(fs.f_bavail) * fs.f_frsize : 0;
  if (anonymous_) {
    return detail::cat(
        "ringreduce shm: rank ", rank, " cannot reserve ", mib(segment_bytes_),
        " of memory for its shared-memory segment (", own_name_, ", a memfd): ", std::strerror(err),
        ". Each rank of a group on this host needs a segment like this one (this group of ", size,
        ": up to ", mib(static_cast<double>(segment_bytes_) * size),
        "), one for the collectives and a smaller one for point-to-point, counted against the "
        "process's memory limit (its cgroup). Raise that limit, or use RINGREDUCE_TRANSPORT=tcp, "
        "or shrink the segments with RINGREDUCE_WINDOW_BYTES, RINGREDUCE_SLICE_BYTES and "
        "RINGREDUCE_SLOTS");
  }
  return detail::cat(
      "ringreduce shm: rank ", rank, " cannot reserve ", mib(segment_bytes_), " in /dev/shm for ",
      own_name_, ": ", std::strerror(err),
      known ? detail::cat(" (/dev/shm holds ", mib(total), ", ", mib(avail), " free)") : std::string(),
      ". Each rank of a group on this host needs a segment like this one (this group of ", size,
      ": up to ", mib(static_cast<double>(segment_bytes_) * size),
      "), one for the collectives and a smaller one for point-to-point. Give /dev/shm more room (docker run --shm-size=1g; "
      "in Kubernetes an emptyDir with medium: Memory mounted there), or use "
      "RINGREDUCE_TRANSPORT=tcp, or shrink the segments with RINGREDUCE_WINDOW_BYTES, "
      "RINGREDUCE_SLICE_BYTES and RINGREDUCE_SLOTS");
}

static_assert(sizeof(MsgHeader) <= kSlotHeaderBytes, "slot header area too small");

ShmTransport::ShmTransport(Bootstrap& bs, const std::string& prefix, int rank, int size,
                           const ShmConfig& cfg, Reach reach, const std::vector<uint8_t>& want)
    : rank_(rank), size_(size), cfg_(cfg), spin_(cfg.spin, cfg.spin_max) {
  RR_CHECK(want.empty() || want.size() == static_cast<size_t>(size), "ringreduce shm: ", want.size(),
           " peer flags for a group of ", size);
  RR_CHECK(size >= 1 && rank >= 0 && rank < size, "ringreduce shm: invalid rank ", rank,
           " for world size ", size);
  RR_CHECK(cfg.slot_bytes >= 64 && cfg.slot_bytes % 64 == 0,
           "ringreduce shm: slot size must be a multiple of 64 bytes and at least 64, got ",
           cfg.slot_bytes);
  // The ring's fused steps hold the slot they receive from while they wait for the slot they send
  // to; with one slot per link every rank could hold one and wait for the next: two break the cycle.
  RR_CHECK(cfg.nslots >= 2 && cfg.nslots <= 1024,
           "ringreduce shm: slots per link must be in [2, 1024], got ", cfg.nslots);
  static_assert(sizeof(Segment) <= kPage, "segment header must fit in one page");
  static_assert(sizeof(Fifo) <= kPage, "fifo control must fit in one page");

  slot_stride_ = round_up(kSlotHeaderBytes + cfg.slot_bytes, kPage);
  fifo_stride_ = kPage + static_cast<size_t>(cfg.nslots) * slot_stride_;
  segment_bytes_ = kPage + static_cast<size_t>(size) * fifo_stride_;
  window_offset_ = segment_bytes_;
  if (cfg.window_bytes != 0) {
    // Four of the largest ops per half are enough for those; a small window stays small.
    const size_t span = cfg.window_span != 0
                            ? cfg.window_span
                            : std::min(2 * private_cache_bytes(512 << 10), 4 * cfg.window_bytes);
    window_half_ = round_up(std::max(cfg.window_bytes, span), kPage);
  }
  segment_bytes_ += 2 * window_half_;
  peer_at_.assign(size, 0);
  bases_.assign(size, nullptr);
  sent_.assign(size, 0);
  received_.assign(size, 0);

  uint64_t token;
  if (rank == 0) {
    token = random_token();
    bs.set(prefix + "shm/token", hex64(token));
  } else {
    token = std::strtoull(bs.get(prefix + "shm/token").c_str(), nullptr, 16);
  }
  own_name_ = "/ringreduce-" + hex64(token) + "-" + std::to_string(rank);

  // Segments without a name where every rank of this machine can be handed this process's
  // descriptors: a memfd, so that nothing is ever linked in /dev/shm (a crash at any moment leaves
  // nothing behind) and /dev/shm's size does not limit the group (the memory counts against the
  // process's cgroup instead). A peer in this process's PID and mount namespaces opens it through
  // /proc/<pid>/fd/<fd>; one in another (a container per rank) that shares the network namespace
  // is handed it through an abstract Unix socket (fd_passing.h). Ranks of one machine in other
  // network namespaces as well are kept apart on purpose (containers, or the hosts that
  // tests/test_netns.py makes): there, named segments in /dev/shm, unlinked once every peer has
  // mapped them, and the probe finds who shares one. Every rank of a machine sees the same ranks,
  // so they all choose alike.
  const std::string machine = machine_id();
  const std::string where = machine + "/" + std::to_string(pid_namespace()) + "/" +
                            std::to_string(mount_namespace()) + "/" + std::to_string(net_namespace());
  bs.set(prefix + "shm/where/" + std::to_string(rank), where);
  // Per peer of this machine: 1 through /proc (and then the socket), 2 through the socket alone.
  std::vector<uint8_t> same_machine(static_cast<size_t>(size), 0);
  bool anonymous = cfg.anonymous && pid_namespace() != 0 && net_namespace() != 0;
  const std::string net = where.substr(where.rfind('/'));
  for (int p = 0; p < size; ++p) {
    if (p == rank || (!want.empty() && !want[p])) continue;
    const std::string theirs = bs.get(prefix + "shm/where/" + std::to_string(p));
    if (!(theirs.size() > machine.size() && theirs.compare(0, machine.size(), machine) == 0 &&
          theirs[machine.size()] == '/')) {
      continue;
    }
    const bool same_net = theirs.size() >= net.size() &&
                          theirs.compare(theirs.size() - net.size(), net.size(), net) == 0;
    same_machine[p] = theirs == where ? 1 : 2;
    // "<machine>/<pid ns>/<mount ns>/<net ns>": a peer that could not read one of them (0) may be
    // anywhere, and ranks in other network namespaces are kept apart: named segments for all.
    const std::string ns = theirs.substr(machine.size()) + "/";
    if (!same_net || ns.find("/0/") != std::string::npos) anonymous = false;
  }
  anonymous_ = anonymous;
  if (!anonymous_) {
    static std::once_flag swept;
    std::call_once(swept, sweep_stale_segments);
  }

  try {
    int fd;
    std::string published;
    if (anonymous_) {
      fd = create_memfd(own_name_.substr(1));
      RR_SYSCHECK(fd >= 0, "ringreduce shm: rank ", rank, " cannot create a memfd segment");
      secret_ = random_token();
      published = detail::cat("memfd:", getpid(), ":", fd, ":", hex64(secret_));
    } else {
      fd = shm_open(own_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      RR_SYSCHECK(fd >= 0, "ringreduce shm: rank ", rank, " cannot create segment ", own_name_);
      own_linked_ = true;
      published = own_name_;
    }
    // Locked shared at once, and for as long as this transport lives: the kernel drops the lock
    // when the process dies, however it dies, which is how peers in another PID namespace (one
    // container per rank, sharing /dev/shm) tell that it has, and how a later job tells a
    // segment its creator left behind (sweep_stale_segments).
    const bool locked = flock(fd, LOCK_SH) == 0;
    // Reserve the pages now: tmpfs otherwise allocates them on first write, and a full /dev/shm
    // would then kill the process with SIGBUS in the middle of an op instead of failing here.
    const int reserved = posix_fallocate(fd, 0, static_cast<off_t>(segment_bytes_));
    if (reserved != 0) {
      close(fd);
      throw Error(no_room_message(rank, size, reserved));
    }
    void* base = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    fds_.assign(size, -1);
    fds_[rank] = fd;  // kept open: it holds the lock
    errno = map_errno;
    RR_SYSCHECK(base != MAP_FAILED, "ringreduce shm: rank ", rank, " cannot map ", segment_bytes_,
                " bytes of shared memory for ", own_name_);
    bases_[rank] = base;
    populate(rank);
    // tmpfs hands out zeroed pages, so every counter below starts at 0.
    Segment* seg = segment(rank);
    seg->magic = kMagic;
    seg->token = token;
    seg->rank = static_cast<uint32_t>(rank);
    seg->world = static_cast<uint32_t>(size);
    seg->slot_bytes = cfg.slot_bytes;
    seg->nslots = cfg.nslots;
    seg->pid = static_cast<int32_t>(getpid());
    seg->pid_ns = pid_namespace();
    seg->locked = locked ? 1 : 0;
    seg->blocked_on.store(-1);
    seg->cpu.store(-1);
    // Handed out, until every peer has mapped it, to the peers of this machine in other PID or
    // mount namespaces, which cannot open it through /proc. Without the socket they take TCP.
    if (anonymous_ && std::any_of(same_machine.begin(), same_machine.end(), [](uint8_t w) { return w == 2; })) {
      try {
        server_ = std::make_unique<FdServer>(own_name_.substr(1), fd, secret_);
      } catch (const Error& e) {
        log::note(rank, detail::cat("peers in other namespaces cannot be handed this rank's segment: ",
                                    e.what()));
      }
    }
    bs.set(prefix + "shm/name/" + std::to_string(rank), published);
    // Dying here leaves a segment that exists and is published but not yet mapped by any peer.
    failpoint("setup.segment", rank);

    // The probe: opening the peer's segment only works if it is on this host (and in the same
    // IPC and mount namespace).
    const bool require = reach == Reach::Require;
    const auto fetch_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (int p = 0; p < size; ++p) {
      if (p == rank || (!want.empty() && !want[p])) continue;
      const std::string name = bs.get(prefix + "shm/name/" + std::to_string(p));
      int pfd;
      if (name.rfind("memfd:", 0) == 0) {
        // "memfd:<pid>:<fd>:<secret>": the owner's descriptor, reopened (the same memory, and the
        // same file for the owner's lock). Only a process of the owner's machine and PID namespace
        // finds it in /proc; another host's rank with that pid fails the segment check below.
        // A peer of this machine in other namespaces asks the owner's socket for it.
        std::vector<std::string> f;
        for (size_t at = 6, next; at <= name.size(); at = next + 1) {
          next = name.find(':', at);
          if (next == std::string::npos) next = name.size();
          f.push_back(name.substr(at, next - at));
        }
        pfd = -1;
        if (anonymous_ && same_machine[p] == 1 && f.size() == 3) {
          pfd = open(("/proc/" + f[0] + "/fd/" + f[1]).c_str(), O_RDWR | O_CLOEXEC);
        } else if (anonymous_ && same_machine[p] == 2 && f.size() == 3) {
          std::string why;
          pfd = fetch_fd("ringreduce-" + hex64(token) + "-" + std::to_string(p),
                         std::strtoull(f[2].c_str(), nullptr, 16), fetch_deadline, &why);
          if (pfd < 0) {
            log::note(rank, detail::cat("rank ", p, "'s shared-memory segment could not be had through its ",
                                        "socket (", why, ")", require ? "" : ": the pair goes over TCP"));
          }
        }
      } else {
        pfd = anonymous_ ? -1 : shm_open(name.c_str(), O_RDWR, 0);
      }
      if (pfd < 0 && !require) continue;
      RR_SYSCHECK(pfd >= 0, "ringreduce shm: rank ", rank, " cannot open rank ", p,
                  "'s shared-memory segment ", name,
                  " (is rank ", p, " on another host? RINGREDUCE_TRANSPORT=shm asks for shared memory "
                  "between all ranks)");
      struct stat st;
      const bool sized = fstat(pfd, &st) == 0 && static_cast<size_t>(st.st_size) == segment_bytes_;
      void* pbase = sized ? mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0)
                          : MAP_FAILED;
      if (pbase == MAP_FAILED) {
        close(pfd);
      } else {
        fds_[p] = pfd;  // for peer_gone(): a lock on it tells whether its owner lives
      }
      if (!sized && !require) continue;
      RR_CHECK(sized, "ringreduce shm: rank ", p, "'s segment has ", st.st_size, " bytes, rank ",
               rank, " expected ", segment_bytes_, " (ranks disagree on slot size or count)");
      RR_SYSCHECK(pbase != MAP_FAILED, "ringreduce shm: rank ", rank, " cannot map rank ", p,
                  "'s segment");
      bases_[p] = pbase;
      populate(p);
      const Segment* ps = segment(p);
      const bool ours = ps->magic == kMagic && ps->token == token &&
                        ps->rank == static_cast<uint32_t>(p) && ps->world == static_cast<uint32_t>(size) &&
                        ps->slot_bytes == cfg.slot_bytes && ps->nslots == cfg.nslots;
      if (!ours && !require) {
        munmap(pbase, segment_bytes_);
        bases_[p] = nullptr;
        close(fds_[p]);
        fds_[p] = -1;
        continue;
      }
      RR_CHECK(ours, "ringreduce shm: rank ", p, "'s segment ", name, " does not belong to this group");
    }
    if (!require) {
      // A pair is local only if both of its ranks opened the other's segment: each says which it
      // opened, and a one-sided mapping is dropped, so both sides route the pair the same way.
      std::string row(static_cast<size_t>(size), '0');
      for (int p = 0; p < size; ++p) row[p] = bases_[p] != nullptr ? '1' : '0';
      bs.set(prefix + "shm/reach/" + std::to_string(rank), row);
      for (int p = 0; p < size; ++p) {
        if (p == rank || bases_[p] == nullptr) continue;
        const std::string theirs = bs.get(prefix + "shm/reach/" + std::to_string(p));
        if (theirs.size() != static_cast<size_t>(size) || theirs[rank] != '1') {
          munmap(bases_[p], segment_bytes_);
          bases_[p] = nullptr;
          close(fds_[p]);
          fds_[p] = -1;
        }
      }
    }

    // Unlink once every peer holds a mapping: from here on a crash leaves nothing behind.
    bs.set(prefix + "shm/mapped/" + std::to_string(rank), "1");
    for (int p = 0; p < size; ++p) {
      if (p != rank) bs.get(prefix + "shm/mapped/" + std::to_string(p));
    }
    if (own_linked_) {
      RR_SYSCHECK(shm_unlink(own_name_.c_str()) == 0, "ringreduce shm: rank ", rank,
                  " cannot unlink its segment ", own_name_);
      own_linked_ = false;
    }
    server_.reset();
  } catch (...) {
    server_.reset();
    if (own_linked_) shm_unlink(own_name_.c_str());
    own_linked_ = false;
    unmap_all();
    throw;
  }
}

ShmTransport::~ShmTransport() {
  if (own_linked_) shm_unlink(own_name_.c_str());
  unmap_all();
}

void ShmTransport::unmap_all() {
  for (auto& b : bases_) {
    if (b != nullptr) munmap(b, segment_bytes_);
    b = nullptr;
  }
  for (int& fd : fds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

bool ShmTransport::peer_gone(int peer) const {
  // Its owner's shared lock on its segment lives exactly as long as the owner's process (or a
  // child it forked, which still holds the descriptor): an exclusive lock that can be taken means
  // it has died, in whatever PID namespace.
  const Segment* ps = segment(peer);
  const int fd = fds_[peer];
  if (ps->locked && fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
    flock(fd, LOCK_UN);
    return true;
  }
  // The pid covers the owner whose lock a forked child still holds; it means something only in
  // this process's namespace.
  return ps->pid_ns != 0 && ps->pid_ns == pid_namespace() && process_gone(ps->pid);
}

std::vector<std::string> ShmTransport::linked_segments() const {
  if (own_linked_) return {own_name_};
  return {};
}

ShmTransport::Segment* ShmTransport::segment(int owner) const {
  return static_cast<Segment*>(bases_[owner]);
}

ShmTransport::Fifo* ShmTransport::fifo(int receiver, int sender) const {
  auto* base = static_cast<uint8_t*>(bases_[receiver]);
  return reinterpret_cast<Fifo*>(base + kPage + static_cast<size_t>(sender) * fifo_stride_);
}

uint8_t* ShmTransport::slot(int receiver, int sender, uint64_t index) const {
  auto* f = reinterpret_cast<uint8_t*>(fifo(receiver, sender));
  return f + kPage + static_cast<size_t>(index % cfg_.nslots) * slot_stride_;
}

void ShmTransport::check_peer(int peer, const char* what) const {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_ && bases_[peer] != nullptr, "ringreduce shm: ",
           what, " on rank ", rank_, " names peer ", peer, ", which is not reachable through shared "
           "memory (world size ", size_, ")");
}

void ShmTransport::throw_aborted(const OpContext& op) const {
  ringreduce::throw_aborted(op, rank_, abort_reason());
}

PeerState ShmTransport::own_state() const {
  const Segment* s = segment(rank_);
  PeerState st;
  st.known = true;
  st.op_seq = s->op_seq.load(std::memory_order_acquire);
  st.blocked_on = s->blocked_on.load(std::memory_order_relaxed);
  return st;
}

void ShmTransport::note_state(uint64_t op_seq, int32_t blocked_on) {
  Segment* s = segment(rank_);
  s->op_seq.store(op_seq, std::memory_order_relaxed);
  s->blocked_on.store(blocked_on, std::memory_order_relaxed);
}

PeerState ShmTransport::peer_state(int peer, const Deadline&) {
  PeerState st;
  const Segment* s = peer >= 0 && peer < size_ && peer != rank_ ? segment(peer) : nullptr;
  if (s == nullptr) {
    st.unknown = "it is on another host, and its state is not visible here";
    return st;
  }
  st.known = true;
  st.op_seq = s->op_seq.load(std::memory_order_acquire);
  st.blocked_on = s->blocked_on.load(std::memory_order_relaxed);
  st.stopped = s->pid_ns != 0 && s->pid_ns == pid_namespace() && process_state(s->pid) == 'T';
  return st;
}

std::string ShmTransport::peer_lost(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_ || bases_[peer] == nullptr) return "";
  const int32_t pid = segment(peer)->pid;
  return peer_gone(peer) ? detail::cat("its process (pid ", pid, ") has died") : "";
}

void ShmTransport::enter(const OpContext& op) {
  Segment* own = segment(rank_);
  own->op_seq.store(op.seq + 1, std::memory_order_relaxed);
  own->cpu.store(sched_getcpu(), std::memory_order_relaxed);
}

void* ShmTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  check_peer(peer, "send");
  enter(op);
  Fifo* f = fifo(peer, rank_);
  const uint32_t seq = static_cast<uint32_t>(sent_[peer]);
  const uint32_t nslots = cfg_.nslots;
  // Free when fewer than nslots messages are unreleased; unsigned arithmetic survives wrap-around.
  wait_until(f->tail, [seq, nslots](uint32_t tail) { return seq - tail < nslots; }, peer,
                          "a free slot: the peer has not consumed earlier messages", op, dl, [] {});
  return slot(peer, rank_, seq) + kSlotHeaderBytes;
}

void ShmTransport::send_end(int peer, const MsgHeader& hdr) {
  RR_CHECK(hdr.bytes <= max_payload(), "ringreduce shm: rank ", rank_, " sends ", hdr.bytes,
           " bytes to rank ", peer, ", more than a slot holds (", max_payload(), ")");
  std::memcpy(slot(peer, rank_, sent_[peer]), &hdr, sizeof hdr);
  sent_[peer] += 1;
  // seq_cst store: orders the payload before it.
  ringreduce::publish(fifo(peer, rank_)->head, static_cast<uint32_t>(sent_[peer]));
  if (cfg_.doorbells) ring(peer);
}

const void* ShmTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                     const Deadline& dl) {
  check_peer(peer, "receive");
  enter(op);
  Fifo* f = fifo(rank_, peer);
  const uint32_t want = static_cast<uint32_t>(received_[peer]);
  wait_until(f->head, [want](uint32_t head) { return head - want - 1 < 0x80000000u; }, peer,
             "its data", op, dl, [] {});
  const uint8_t* s = slot(rank_, peer, received_[peer]);
  std::memcpy(hdr, s, sizeof *hdr);
  // The header came from another process: never let it steer a read past the slot.
  RR_CHECK(hdr->bytes <= max_payload(), op_prefix(op.name, op.seq, rank_), "got a message of ", hdr->bytes, " bytes from rank ", peer, ", larger than a slot (",
           max_payload(), ")");
  return s + kSlotHeaderBytes;
}

void ShmTransport::recv_end(int peer) {
  received_[peer] += 1;
  ringreduce::publish(fifo(rank_, peer)->tail, static_cast<uint32_t>(received_[peer]));
  if (cfg_.doorbells) ring(peer);
}

void* ShmTransport::try_send_begin(int peer) {
  check_peer(peer, "send");
  if (segment(rank_)->aborted.load(std::memory_order_acquire)) {
    ringreduce::throw_aborted(rank_, abort_reason());
  }
  const uint32_t seq = static_cast<uint32_t>(sent_[peer]);
  const uint32_t tail = fifo(peer, rank_)->tail.value.load(std::memory_order_acquire);
  if (seq - tail >= cfg_.nslots) return nullptr;
  return slot(peer, rank_, seq) + kSlotHeaderBytes;
}

const void* ShmTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  check_peer(peer, "receive");
  if (segment(rank_)->aborted.load(std::memory_order_acquire)) {
    ringreduce::throw_aborted(rank_, abort_reason());
  }
  const uint32_t want = static_cast<uint32_t>(received_[peer]);
  const uint32_t head = fifo(rank_, peer)->head.value.load(std::memory_order_acquire);
  if (head - want - 1 >= 0x80000000u) return nullptr;
  const uint8_t* s = slot(rank_, peer, received_[peer]);
  std::memcpy(hdr, s, sizeof *hdr);
  RR_CHECK(hdr->bytes <= max_payload(), "ringreduce shm: rank ", rank_, " got a message of ",
           hdr->bytes, " bytes from rank ", peer, ", larger than a slot (", max_payload(), ")");
  return s + kSlotHeaderBytes;
}

void ShmTransport::ring(int owner) { bump(segment(owner)->doorbell); }

uint32_t ShmTransport::doorbell() const {
  return segment(rank_)->doorbell.value.load(std::memory_order_seq_cst);
}

void ShmTransport::ring_doorbell() { ring(rank_); }

void ShmTransport::wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) {
  WaitWord& w = segment(rank_)->doorbell;
  Segment* own = segment(rank_);
  auto moved = [&] { return w.value.load(std::memory_order_acquire) != seen; };
  if (spin_until(moved, std::min<std::chrono::nanoseconds>(at_most, cfg_.spin))) return;
  sleep_on(w, std::min<std::chrono::nanoseconds>(at_most, kMaxSleep), [&](uint32_t v) {
    return v == seen && !own->aborted.load(std::memory_order_seq_cst);
  });
}

void ShmTransport::abort_group(const std::string& why) {
  for (int r = 0; r < size_; ++r) {
    Segment* seg = segment(r);
    if (seg == nullptr) continue;
    uint32_t expected = 0;
    if (seg->abort_claimed.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      const size_t n = std::min(why.size(), kReasonBytes - 1);
      std::memcpy(seg->reason, why.data(), n);
      seg->reason[n] = '\0';
      seg->aborted.store(1, std::memory_order_seq_cst);
    }
    // Wake everybody sleeping on this segment's FIFOs so they see the flag now.
    for (int s = 0; s < size_; ++s) {
      Fifo* f = fifo(r, s);
      futex::wake_all(&f->head.value);
      futex::wake_all(&f->tail.value);
    }
    futex::wake_all(&seg->doorbell.value);
  }
}

std::string ShmTransport::abort_reason() const {
  const Segment* seg = segment(rank_);
  if (seg == nullptr || !seg->aborted.load(std::memory_order_acquire)) return "";
  return std::string(seg->reason, strnlen(seg->reason, kReasonBytes));
}

}  // namespace ringreduce

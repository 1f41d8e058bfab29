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

namespace ringreduce {

using shm::create_memfd;
using shm::mount_namespace;
using shm::net_namespace;
using shm::pid_namespace;
using shm::process_gone;
using shm::process_state;
using shm::sweep_stale_segments;

namespace {

constexpr uint64_t kMagic = 0x7272696e67726564ULL;  // "rringred"
constexpr size_t kPage = 4096;
// Window ops smaller than this do not move through the window (ShmTransport::begin).
constexpr size_t kWindowMoveMinBytes = 4096;
constexpr size_t kSlotHeaderBytes = 64;  // MsgHeader, padded so payloads start 64-byte aligned
constexpr size_t kReasonBytes = 2048;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

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

// At offset 0 of every segment. Written by the owner before it publishes the name, then read-only
// except for the abort fields, which any rank may write.
struct ShmTransport::Segment {
  uint64_t magic;
  uint64_t token;
  uint32_t rank;
  uint32_t world;
  uint64_t slot_bytes;
  uint32_t nslots;
  int32_t pid;  // the owner's process: a waiter that finds it gone knows its peer died
  uint64_t pid_ns;  // the namespace `pid` lives in (pid_namespace())
  uint32_t locked;  // 1: the owner holds a shared lock on the segment for its lifetime
  // Where this rank is, for a peer that times out to find who is really missing: the op it last
  // entered the transport in (seq + 1, 0 before the first) and the peer it sleeps on (-1: none).
  alignas(64) std::atomic<uint64_t> op_seq;
  std::atomic<int32_t> blocked_on;
  // The CPU the owner ran on when it last entered an op or spun in a wait: a peer that finds it
  // equal to its own does not spin for the owner, which cannot run while it does (wait_until).
  std::atomic<int32_t> cpu;
  alignas(64) std::atomic<uint32_t> aborted;      // 1 once `reason` is complete
  std::atomic<uint32_t> abort_claimed;            // first writer of `reason` wins
  char reason[kReasonBytes];
  // Bumped by peers on every message to / slot freed for this rank, where doorbells are on.
  alignas(64) WaitWord doorbell;
  // The window (PeerWindow): phases published by the owner; for its current and previous op
  // (by op count modulo 2), the op's fingerprint and where its region starts in the window area;
  // and whether it waits in a window op now (for a peer that looks for a desync between a window
  // op and a message op).
  alignas(64) WaitWord wstamp;
  alignas(64) MsgHeader whdr[2];
  uint64_t wat[2];
  std::atomic<uint32_t> in_window;
};

// One per (receiver, sender) pair, in the receiver's segment. head is written only by the sender,
// tail only by the receiver; they sit on separate cache lines so the two sides do not false-share.
struct ShmTransport::Fifo {
  alignas(64) WaitWord head;  // messages published by the sender
  alignas(64) WaitWord tail;  // messages released by the receiver
};

static_assert(sizeof(MsgHeader) <= kSlotHeaderBytes, "slot header area too small");

ShmTransport::ShmTransport(Bootstrap& bs, const std::string& prefix, int rank, int size,
                           const ShmConfig& cfg, Reach reach, const std::vector<uint8_t>& want)
    : rank_(rank), size_(size), cfg_(cfg) {
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
    // MAP_POPULATE: every page of a rank's own segment is used, and a page first touched in an op
    // costs that op a fault (see populate()).
    void* base = mmap(nullptr, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int map_errno = errno;
    fds_.assign(size, -1);
    fds_[rank] = fd;  // kept open: it holds the lock
    errno = map_errno;
    RR_SYSCHECK(base != MAP_FAILED, "ringreduce shm: rank ", rank, " cannot map ", segment_bytes_,
                " bytes of shared memory for ", own_name_);
    bases_[rank] = base;
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

void ShmTransport::populate(int peer) const {
#ifdef MADV_POPULATE_WRITE
  // What this rank touches in a peer's segment: its header, the FIFO this rank sends into, and the
  // window, which every window op reads across. Not the rest: the FIFOs of the other senders would
  // be as many page-table entries again per peer, and at a hundred ranks a host that is gigabytes.
  // Each page is otherwise mapped by a fault at its first touch, in the middle of an op, and window
  // ops walk their regions through the halves (PeerWindow), so a new size's ops kept faulting for
  // a long while (docs/results.md has the cost). Where the kernel lacks MADV_POPULATE_WRITE (before
  // 5.14) the pages fault in as before.
  auto* base = static_cast<uint8_t*>(bases_[peer]);
  madvise(base, kPage, MADV_POPULATE_WRITE);
  madvise(base + kPage + static_cast<size_t>(rank_) * fifo_stride_, fifo_stride_, MADV_POPULATE_WRITE);
  if (window_half_ != 0) madvise(base + window_offset_, 2 * window_half_, MADV_POPULATE_WRITE);
#else
  (void)peer;
#endif
}

size_t ShmTransport::unmapped_window_pages(int peer) const {
  if (window_half_ == 0 || !is_local(peer)) return 0;
  // /proc/self/pagemap: one 64-bit entry per virtual page, bit 63 set where the page is mapped.
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  RR_SYSCHECK(fd >= 0, "ringreduce shm: cannot open /proc/self/pagemap");
  const auto first = (reinterpret_cast<uintptr_t>(bases_[peer]) + window_offset_) / kPage;
  const size_t pages = 2 * window_half_ / kPage;
  std::vector<uint64_t> entries(pages);
  const ssize_t got = pread(fd, entries.data(), pages * sizeof(uint64_t), static_cast<off_t>(first * sizeof(uint64_t)));
  close(fd);
  RR_CHECK(got == static_cast<ssize_t>(pages * sizeof(uint64_t)), "ringreduce shm: short read of /proc/self/pagemap");
  return static_cast<size_t>(std::count_if(entries.begin(), entries.end(), [](uint64_t e) { return (e >> 63) == 0; }));
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

template <class Ready, class Check>
void ShmTransport::wait_until(WaitWord& word, Ready ready, int peer, const char* waiting_for,
                              const OpContext& op, const Deadline& dl, Check check) {
  auto now_ready = [&] { return ready(word.value.load(std::memory_order_acquire)); };
  if (now_ready()) return;
  Segment* own = segment(rank_);
  auto is_aborted = [own] { return own->aborted.load(std::memory_order_acquire) != 0; };
  if (is_aborted()) throw_aborted(op);

  // Spin first: when the peer is running, the hand-off is a cache-line transfer away. Unless
  // the scheduler has put the peer on this rank's own CPU (ranks move between CPUs, and a third
  // process that keeps one busy crowds both ranks onto the other): then the peer cannot run while
  // this rank spins, and every spin would cost a whole time slice, so yield it the CPU instead.
  const Segment* ps = segment(peer);
  unsigned polls = 0;
  auto ready_or_yield = [&] {
    if (now_ready()) return true;
    if (++polls % kPollsPerClockRead == 0) {
      // Stored only when it moved: the peer reads this line as often, and a store of the same
      // value would still take the line from it each time.
      const int cpu = sched_getcpu();
      if (own->cpu.load(std::memory_order_relaxed) != cpu) own->cpu.store(cpu, std::memory_order_relaxed);
      if (cpu == ps->cpu.load(std::memory_order_relaxed)) {
        ++yields_to_peer_;
        sched_yield();
      }
    }
    return false;
  };
  if (spin_until(ready_or_yield, cfg_.spin)) return;

  // From here on we yield or sleep: say on whom, so a peer that times out can follow the chain.
  own->blocked_on.store(peer, std::memory_order_relaxed);
  struct Unblock {
    Segment* s;
    ~Unblock() { s->blocked_on.store(-1, std::memory_order_relaxed); }
  } unblock{own};
  if (cfg_.yield.count() > 0) {
    const auto yield_until = Clock::now() + cfg_.yield;
    do {
      sched_yield();
      if (now_ready()) return;
      if (is_aborted()) throw_aborted(op);
    } while (Clock::now() < yield_until);
    check();
  }
  const PeerWait w(*this, chain_view(), peer, waiting_for, op, dl);
  for (;;) {
    if (is_aborted()) throw_aborted(op);
    if (w.expired()) w.timed_out("");
    sleep_on(word, w.nap(), [&](uint32_t v) {
      return !ready(v) && !own->aborted.load(std::memory_order_seq_cst);
    });
    if (now_ready()) return;
    // Woken without progress (at most every kMaxSleep): a peer that died is not waited for until
    // the deadline. An abort comes first: a rank that failed for another reason and then exited
    // has said why.
    if (is_aborted()) throw_aborted(op);
    check();
    const int32_t pid = segment(peer)->pid;
    if (peer_gone(peer)) {
      w.peer_gone("was waiting for", detail::cat("whose process (pid ", pid, ") has died"));
    }
  }
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

PeerWindow* ShmTransport::window() {
  if (cfg_.window_bytes == 0) return nullptr;
  for (int p = 0; p < size_; ++p) {
    if (bases_[p] == nullptr) return nullptr;
  }
  return this;
}

uint8_t* ShmTransport::begin(const MsgHeader& fp, const OpContext& op, size_t bytes) {
  RR_CHECK(bytes <= cfg_.window_bytes, op_prefix(op.name, op.seq, rank_), "a window op of ", bytes,
           " bytes, larger than the window (", cfg_.window_bytes, ")");
  Segment* own = segment(rank_);
  enter(op);
  ++window_ops_;
  window_fp_ = fp;
  // The region after the previous op's, or the start of the other half where it does not fit:
  // never over the previous op's, which a peer may still read (see PeerWindow). The smallest ops
  // take the start of the other half every time: a few lines gain nothing from moving, and
  // fixed places keep the pages of a loop of small ops few.
  if (bytes >= kWindowMoveMinBytes && window_next_ + bytes <= (window_side_ + 1) * window_half_) {
    window_at_ = window_next_;
  } else {
    window_side_ ^= 1;
    window_at_ = window_side_ * window_half_;
  }
  window_next_ = window_at_ + round_up(bytes, 64);
  // Safe to write before publishing: a peer reads these only after it has seen this op's first
  // phase, and no peer still reads those of op k-2 (see PeerWindow).
  own->whdr[window_ops_ % 2] = fp;
  own->wat[window_ops_ % 2] = window_at_;
  return static_cast<uint8_t*>(bases_[rank_]) + window_offset_ + window_at_;
}

const uint8_t* ShmTransport::buffer(int rank) const {
  const size_t at = rank == rank_ ? window_at_ : peer_at_[rank];
  return static_cast<const uint8_t*>(bases_[rank]) + window_offset_ + at;
}

void ShmTransport::publish() {
  ++window_stamp_;
  // seq_cst store: orders the buffer's contents and the header before it.
  ringreduce::publish(segment(rank_)->wstamp, window_stamp_);
}

std::string ShmTransport::message_op_of(int peer, const MsgHeader& fp) const {
  // Every message of an earlier op has been received by the time it ended, so one waiting now is
  // of the op the peer is in.
  const Fifo* f = fifo(rank_, peer);
  if (f->head.value.load(std::memory_order_acquire) != static_cast<uint32_t>(received_[peer])) {
    MsgHeader h;
    std::memcpy(&h, slot(rank_, peer, received_[peer]), sizeof h);
    return detail::cat("rank ", peer, " sent ", describe_op(h));
  }
  const Segment* ps = segment(peer);
  if (ps->op_seq.load(std::memory_order_acquire) == fp.seq + 1 &&
      ps->blocked_on.load(std::memory_order_relaxed) == rank_ &&
      ps->in_window.load(std::memory_order_relaxed) == 0) {
    return detail::cat("rank ", peer, " waits for a message from rank ", rank_, " in op #", fp.seq);
  }
  return "";
}

void ShmTransport::wait_all(const OpContext& op, const Deadline& dl) {
  Segment* own = segment(rank_);
  own->in_window.store(1, std::memory_order_relaxed);
  struct Leave {
    Segment* s;
    ~Leave() { s->in_window.store(0, std::memory_order_relaxed); }
  } leave{own};
  const uint32_t want = window_stamp_;
  const MsgHeader& fp = window_fp_;
  auto differ = [&](int peer, const std::string& theirs) {
    const std::string aborted = abort_reason();
    if (!aborted.empty()) throw_aborted(op);
    const std::string msg = detail::cat(op_prefix(op.name, op.seq, rank_), "this rank and rank ",
                                        peer, " called different collectives: ",
                                        theirs, ", rank ", rank_, " is in ", describe_op(fp));
    abort_group(msg);
    throw Error(msg);
  };
  // Peers in ring order from this rank's successor: each rank starts with a different one.
  for (int i = 1; i < size_; ++i) {
    const int p = (rank_ + i) % size_;
    Segment* ps = segment(p);
    wait_until(ps->wstamp, [want](uint32_t v) { return static_cast<int32_t>(v - want) >= 0; }, p,
               "its part of the op in shared memory", op, dl, [&] {
                 // Every peer, not only the one waited for: the one in a message op may be
                 // waiting for a third rank, or sending to this one.
                 for (int q = 0; q < size_; ++q) {
                   if (q == rank_) continue;
                   const std::string theirs = message_op_of(q, fp);
                   if (!theirs.empty()) differ(q, theirs);
                 }
               });
    const MsgHeader got = ps->whdr[window_ops_ % 2];
    if (!same_op(got, fp) || got.bytes != fp.bytes) {
      differ(p, detail::cat("rank ", p, " is in ", describe_op(got)));
    }
    // The same op on both sides: the peer's region is as long as this rank's.
    const size_t at = ps->wat[window_ops_ % 2];
    RR_CHECK(at + (window_next_ - window_at_) <= 2 * window_half_, op_prefix(op.name, op.seq, rank_),
             "rank ", p, "'s window region of this op (at ", at, ") lies outside its window");
    peer_at_[p] = at;
  }
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

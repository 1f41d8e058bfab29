// ShmTransport's PeerWindow: the window ops over every rank's segment (docs/algorithms.md, "The
// shared window"), and the set-up that maps the pages a rank uses in its peers' segments.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/shm/shm_internal.h"
#include "transport/shm/shm_transport.h"

namespace ringreduce {

using shm::kPage;
using shm::kWindowMoveMinBytes;
using shm::round_up;

void ShmTransport::populate(int owner) const {
#ifdef MADV_POPULATE_WRITE
  // The window, which every window op reads across in every segment, and the header. Not the
  // FIFOs: a ring's slices move 64 KiB and more per hand-off, next to which a fault per page is
  // small, and mapping them in every segment (they grow with the group) cost more set-up time
  // than the window's pages did. A window page is otherwise mapped by a fault at its first touch,
  // in the middle of an op, and window ops walk their regions through the halves (PeerWindow), so
  // a new size's ops kept faulting for a long while (docs/results.md has the cost). Where the
  // kernel lacks MADV_POPULATE_WRITE (before 5.14) the pages fault in as before.
  auto* base = static_cast<uint8_t*>(bases_[owner]);
  madvise(base, kPage, MADV_POPULATE_WRITE);
  if (window_half_ != 0) madvise(base + window_offset_, 2 * window_half_, MADV_POPULATE_WRITE);
#else
  (void)owner;
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

}  // namespace ringreduce

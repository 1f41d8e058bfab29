#include "transport/routed.h"

#include "common/error.h"

namespace ringreduce {

RoutedTransport::RoutedTransport(int rank, int size, ShmTransport* shm, TcpTransport* tcp,
                                 std::vector<uint8_t> over_tcp)
    : rank_(rank), size_(size), shm_(shm), tcp_(tcp), over_tcp_(std::move(over_tcp)) {
  RR_CHECK(over_tcp_.size() == static_cast<size_t>(size), "ringreduce: ", over_tcp_.size(),
           " routes for a group of ", size);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    RR_CHECK(over_tcp_[p] ? tcp_ != nullptr : (shm_ != nullptr && shm_->is_local(p)),
             "ringreduce: rank ", rank, " has no transport to rank ", p);
  }
  if (shm_) shm_->follow_chains_through(this);
  if (tcp_) tcp_->follow_chains_through(this);
}

TcpHooks RoutedTransport::hooks_beside(ShmTransport* shm) {
  TcpHooks h;
  if (shm == nullptr) return h;
  h.on_abort = [shm](const std::string& why) { shm->abort_group(why); };
  h.external_abort = [shm] { return shm->abort_reason(); };
  h.ring_doorbell = [shm] { shm->ring_doorbell(); };
  h.own_state = [shm] { return shm->own_state(); };
  h.note_state = [shm](uint64_t op_seq, int32_t blocked_on) { shm->note_state(op_seq, blocked_on); };
  return h;
}

size_t RoutedTransport::max_payload() const {
  if (shm_ && tcp_) return std::min(shm_->max_payload(), tcp_->max_payload());
  return shm_ ? shm_->max_payload() : tcp_->max_payload();
}

Transport& RoutedTransport::to(int peer) const {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_, "ringreduce: rank ", rank_,
           " names invalid peer ", peer, " (world size ", size_, ")");
  if (over_tcp_[peer]) return *tcp_;
  return *shm_;
}

void RoutedTransport::cross_abort() {
  if (shm_ == nullptr || tcp_ == nullptr) return;
  const std::string s = shm_->abort_reason();
  if (!s.empty()) tcp_->abort_group(s);
  const std::string t = tcp_->abort_reason();
  if (!t.empty()) shm_->abort_group(t);
}

// Every blocking call: an error from one side is the whole group's.
#define RR_ROUTED(call)   \
  try {                   \
    return call;          \
  } catch (const Error&) { \
    cross_abort();        \
    throw;                \
  }

void* RoutedTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  RR_ROUTED(to(peer).send_begin(peer, op, dl))
}

void RoutedTransport::send_end(int peer, const MsgHeader& hdr) { RR_ROUTED(to(peer).send_end(peer, hdr)) }

const void* RoutedTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                        const Deadline& dl) {
  RR_ROUTED(to(peer).recv_begin(peer, hdr, op, dl))
}

void RoutedTransport::recv_end(int peer) { RR_ROUTED(to(peer).recv_end(peer)) }

void* RoutedTransport::try_send_begin(int peer) { RR_ROUTED(to(peer).try_send_begin(peer)) }

const void* RoutedTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  RR_ROUTED(to(peer).try_recv_begin(peer, hdr))
}

#undef RR_ROUTED

void RoutedTransport::land_recvs(int peer, LandFn land) { to(peer).land_recvs(peer, std::move(land)); }

void RoutedTransport::stop_landing(int peer) { to(peer).stop_landing(peer); }

// With shared memory present, the TCP side rings the shared-memory doorbell (hooks_beside), so
// one doorbell covers both.
uint32_t RoutedTransport::doorbell() const { return shm_ ? shm_->doorbell() : tcp_->doorbell(); }

void RoutedTransport::ring_doorbell() {
  if (shm_) {
    shm_->ring_doorbell();
  } else {
    tcp_->ring_doorbell();
  }
}

void RoutedTransport::wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) {
  if (shm_) {
    shm_->wait_doorbell(seen, at_most);
  } else {
    tcp_->wait_doorbell(seen, at_most);
  }
}

void RoutedTransport::abort_group(const std::string& why) {
  if (shm_) shm_->abort_group(why);
  if (tcp_) tcp_->abort_group(why);
}

std::string RoutedTransport::abort_reason() const {
  std::string r = shm_ ? shm_->abort_reason() : std::string();
  if (r.empty() && tcp_) r = tcp_->abort_reason();
  return r;
}

void RoutedTransport::note_state(uint64_t op_seq, int32_t blocked_on) {
  if (shm_) shm_->note_state(op_seq, blocked_on);
  if (tcp_) tcp_->note_state(op_seq, blocked_on);
}

PeerState RoutedTransport::own_state() const {
  // The TCP side merges in the shared-memory side's (hooks_beside).
  return tcp_ ? tcp_->own_state() : shm_->own_state();
}

PeerState RoutedTransport::peer_state(int peer, const Deadline& dl) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    PeerState s;
    s.unknown = detail::cat("rank ", peer, " is not a peer of rank ", rank_);
    return s;
  }
  return to(peer).peer_state(peer, dl);
}

std::string RoutedTransport::peer_lost(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return "";
  return to(peer).peer_lost(peer);
}

}  // namespace ringreduce

#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "transport/tcp/address.h"
#include "transport/tcp/conn.h"

namespace ringreduce {

TcpHooks TcpHooks::beside(GroupControl* control) {
  TcpHooks h;
  if (control == nullptr) return h;
  h.on_abort = [control](const std::string& why) { control->abort_group(why); };
  h.external_abort = [control] { return control->abort_reason(); };
  h.ring_doorbell = [control] { control->ring_doorbell(); };
  h.own_state = [control] { return control->own_state(); };
  h.note_state = [control](uint64_t op_seq, int32_t blocked_on) {
    control->note_state(op_seq, blocked_on);
  };
  return h;
}

namespace {

// At teardown, how long the Bye frames may take to leave.
constexpr std::chrono::milliseconds kByeTimeout{2000};
// How long a thread that aborts the group waits for its Abort frames to be on the wire: the caller
// may end its process as soon as the error reaches it, and a peer that then sees the connection
// close before the frame would report a crash instead of the reason.
constexpr std::chrono::milliseconds kAbortFlushTimeout{1000};

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace

TcpTransport::TcpTransport(Bootstrap& bs, const std::string& prefix, int rank, int size,
                           const TcpConfig& cfg, const std::vector<uint8_t>& peers, TcpHooks hooks)
    : rank_(rank), size_(size), cfg_(cfg), hooks_(std::move(hooks)) {
  RR_CHECK(size >= 1 && rank >= 0 && rank < size, "ringreduce tcp: invalid rank ", rank,
           " for world size ", size);
  RR_CHECK(peers.size() == static_cast<size_t>(size), "ringreduce tcp: ", peers.size(),
           " peer flags for a group of ", size);
  RR_CHECK(cfg.slot_bytes >= 64 && cfg.slot_bytes % 64 == 0 && cfg.slot_bytes <= (64u << 20),
           "ringreduce tcp: slot size must be a multiple of 64 bytes in [64, 64M], got ", cfg.slot_bytes);
  RR_CHECK(cfg.nslots >= 2 && cfg.nslots <= 1024, "ringreduce tcp: slots per link must be in [2, 1024], got ",
           cfg.nslots);
  RR_CHECK(cfg.sockets >= 1 && cfg.sockets <= 64, "ringreduce tcp: sockets per peer must be in [1, 64], got ",
           cfg.sockets);
  slot_stride_ = round_up(tcp::kPayloadAt + cfg.slot_bytes, 64);
  handshake_ = tcp::Handshake(bs, prefix, rank, size, cfg.sockets, cfg.slot_bytes);


  peers_.resize(size);
  for (int p = 0; p < size; ++p) {
    if (p == rank || !peers[p]) continue;
    auto pr = std::make_unique<Peer>();
    pr->connected = true;
    pr->conns.assign(cfg.sockets, nullptr);
    // Owned here, one set per connected peer: nslots slots each way.
    pr->send_mem.assign(cfg.nslots * slot_stride_, 0);
    pr->send_busy.assign(cfg.nslots, 0);
    pr->recv_mem.assign(cfg.nslots * slot_stride_, 0);
    pr->recv_full.assign(cfg.nslots, 0);
    pr->recv_hdr.assign(cfg.nslots, MsgHeader{});
    pr->recv_landed.assign(cfg.nslots, nullptr);
    peers_[p] = std::move(pr);
    expected_conns_ += static_cast<int>(cfg.sockets);
  }

  try {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    RR_SYSCHECK(listen_fd_ >= 0, "ringreduce tcp: rank ", rank, " cannot create a socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    RR_CHECK(inet_pton(AF_INET, cfg.listen_address.c_str(), &addr.sin_addr) == 1,
             "ringreduce tcp: rank ", rank, ": '", cfg.listen_address, "' is not an IPv4 address");
    RR_SYSCHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
                "ringreduce tcp: rank ", rank, " cannot listen on ", cfg.listen_address);
    RR_SYSCHECK(listen(listen_fd_, 128) == 0, "ringreduce tcp: rank ", rank, " cannot listen");
    socklen_t len = sizeof addr;
    RR_SYSCHECK(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                "ringreduce tcp: getsockname");
    address_ = tcp::sockaddr_text(addr);

    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    RR_SYSCHECK(epoll_fd_ >= 0, "ringreduce tcp: epoll_create1");
    event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    RR_SYSCHECK(event_fd_ >= 0, "ringreduce tcp: eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &event_fd_;
    RR_SYSCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev) == 0, "ringreduce tcp: epoll_ctl");
    ev.data.ptr = &listen_fd_;
    RR_SYSCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0, "ringreduce tcp: epoll_ctl");
    io_ = std::thread([this] { io_loop(); });

    bs.set(prefix + "tcp/addr/" + std::to_string(rank), address_);
    const Deadline dl = Deadline::after(cfg.connect_timeout);
    // The higher rank of a pair connects; the lower one's I/O thread accepts.
    for (int p = 0; p < rank; ++p) {
      if (!peers[p]) continue;
      const std::string where = bs.get(prefix + "tcp/addr/" + std::to_string(p));
      for (uint32_t s = 0; s < cfg.sockets; ++s) connect_to(p, s, where, dl);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, dl.at, [this] { return established_ == expected_conns_ || aborted_; });
    if (aborted_) throw Error(detail::cat("ringreduce tcp: rank ", rank_, ": ", reason_));
    if (established_ != expected_conns_) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p) {
        if (!peers_[p]) continue;
        const auto n = std::count(peers_[p]->conns.begin(), peers_[p]->conns.end(), nullptr);
        if (n) missing += detail::cat(missing.empty() ? "" : ", ", "rank ", p, " (", n, " of ",
                                      cfg.sockets, " sockets)");
      }
      throw Error(detail::cat("ringreduce tcp: rank ", rank_, " (listening on ", address_,
                              ") timed out after ", cfg.connect_timeout.count(),
                              " ms waiting for connections from ", missing));
    }
  } catch (...) {
    close_all();
    throw;
  }
}

void TcpTransport::close_all() {
  stop_ = true;
  wake_io();
  if (io_.joinable()) io_.join();
  for (auto* list : {&io_conns_, &pending_, &adopted_}) {
    for (auto& c : *list) {
      if (c->fd >= 0) close(c->fd);
      c->fd = -1;
    }
  }
  for (int* fd : {&listen_fd_, &epoll_fd_, &event_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

TcpTransport::~TcpTransport() {
  // Say goodbye on every connection, so that peers tell this from a crash, and let it leave.
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& pr : peers_) {
      if (!pr) continue;
      for (Conn* c : pr->conns) {
        if (c != nullptr && !c->closed) c->ctrl.push_back({tcp::FrameType::Bye, {}});
      }
    }
  }
  wake_io();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, Clock::now() + kByeTimeout, [this] {
      for (auto& pr : peers_) {
        if (!pr) continue;
        for (Conn* c : pr->conns) {
          if (c != nullptr && !c->closed && !c->ctrl.empty()) return false;
        }
      }
      return true;
    });
  }
  close_all();
}

void TcpTransport::log(const std::string& what) const {
  log::note(rank_, "tcp: " + what);
}

// ---- the ring's side ---------------------------------------------------------------------------

void TcpTransport::check_peer(int peer, const char* what) const {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_ && peers_[peer], "ringreduce tcp: ", what,
           " on rank ", rank_, " names peer ", peer, ", which is not connected over TCP");
}

template <class Ready>
void TcpTransport::wait_until(std::unique_lock<std::mutex>& lock, Ready ready, int peer,
                              const char* waiting_for, const OpContext& op, const Deadline& dl) {
  op_seq_.store(op.seq + 1, std::memory_order_relaxed);
  if (hooks_.note_state) hooks_.note_state(op.seq + 1, -1);
  if (ready()) return;
  // From here on we sleep: say on whom, for a peer that follows the chain of waits.
  blocked_on_.store(peer, std::memory_order_relaxed);
  if (hooks_.note_state) hooks_.note_state(op.seq + 1, peer);
  struct Unblock {
    TcpTransport& t;
    uint64_t at;
    ~Unblock() {
      t.blocked_on_.store(-1, std::memory_order_relaxed);
      if (t.hooks_.note_state) t.hooks_.note_state(at, -1);
    }
  } unblock{*this, op.seq + 1};
  const PeerWait w(*this, chain_view(), peer, waiting_for, op, dl);
  for (;;) {
    if (ready()) return;
    if (aborted_) w.aborted(reason_);
    if (hooks_.external_abort) {
      const std::string elsewhere = hooks_.external_abort();
      if (!elsewhere.empty()) {
        lock.unlock();
        abort_group(elsewhere);  // pass it on to the peers over TCP
        w.aborted(elsewhere);
      }
    }
    if (peers_[peer]->departed(cfg_.sockets)) {
      lock.unlock();
      w.peer_gone("waits for", "which has shut its process group down");
    }
    if (w.expired()) {
      lock.unlock();
      w.timed_out(" over TCP");
    }
    cv_.wait_for(lock, w.nap());
  }
}

void* TcpTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  check_peer(peer, "send");  // wait_until records the op in op_seq_
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  const size_t s = pr.sent % cfg_.nslots;
  wait_until(lock, [&] { return !pr.send_busy[s]; }, peer,
             "a free slot: earlier messages are not on the wire yet", op, dl);
  return pr.send_mem.data() + s * slot_stride_ + tcp::kPayloadAt;
}

void TcpTransport::send_end(int peer, const MsgHeader& hdr) {
  RR_CHECK(hdr.bytes <= cfg_.slot_bytes, "ringreduce tcp: rank ", rank_, " sends ", hdr.bytes,
           " bytes to rank ", peer, ", more than a slot holds (", cfg_.slot_bytes, ")");
  Peer& pr = *peers_[peer];
  uint8_t* slot = pr.send_mem.data() + (pr.sent % cfg_.nslots) * slot_stride_;
  tcp::FrameHead h;
  h.type = static_cast<uint32_t>(tcp::FrameType::Data);
  h.len = static_cast<uint32_t>(sizeof(MsgHeader) + hdr.bytes);
  std::memcpy(slot + tcp::kFrameAt, &h, sizeof h);
  std::memcpy(slot + tcp::kHeaderAt, &hdr, sizeof hdr);
  Conn* c;
  uint64_t k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = pr.sent++;
    pr.send_busy[k % cfg_.nslots] = 1;
    c = pr.conns[k % cfg_.sockets];
    const bool idle = c->outq.empty() && c->ctrl.empty() && !c->writing && !c->closed;
    c->outq.push_back(k);
    if (!idle) return;  // the I/O thread keeps writing while a queue is non-empty
    // Nothing ahead of it: write it from this thread, which saves a hand-off to the I/O thread
    // and back per message (two wake-ups, on a machine whose cores the ranks share). Whatever
    // the socket does not take now is left to the I/O thread.
    c->writing = true;
    c->writing_ctrl = false;
    c->inline_writer = true;
    c->out_off = 0;
  }
  const uint8_t* data = slot + tcp::kFrameAt;
  const size_t total = (tcp::kPayloadAt - tcp::kFrameAt) + hdr.bytes;
  size_t off = 0;
  int err = 0;
  bool wake = false;
  while (off < total) {
    const ssize_t n = send(c->fd, data + off, total - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) err = errno;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->inline_writer = false;
    c->out_off = off;
    if (off == total) {
      c->writing = false;
      c->outq.pop_front();
      pr.send_busy[k % cfg_.nslots] = 0;
    }
    // The rest (or the error, which the I/O thread's own send will meet and report) goes on
    // there, and so do control frames queued while this thread had the socket.
    if (off != total || err != 0 || !c->ctrl.empty()) wake = true;
  }
  if (wake) wake_io();
}

const void* TcpTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                     const Deadline& dl) {
  check_peer(peer, "receive");
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  const size_t s = pr.received % cfg_.nslots;
  wait_until(lock, [&] { return pr.recv_full[s] != 0; }, peer, "its data", op, dl);
  *hdr = pr.recv_hdr[s];
  if (pr.recv_landed[s] != nullptr) return pr.recv_landed[s];
  return pr.recv_mem.data() + s * slot_stride_ + tcp::kPayloadAt;
}

void TcpTransport::recv_end(int peer) {
  Peer& pr = *peers_[peer];
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pr.recv_full[pr.received % cfg_.nslots] = 0;
    pr.recv_landed[pr.received % cfg_.nslots] = nullptr;
    ++pr.received;
    wake = pr.io_waiting;
    pr.io_waiting = false;
  }
  if (wake) wake_io();
}

void* TcpTransport::try_send_begin(int peer) {
  check_peer(peer, "send");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw_aborted(rank_, reason_);
  const size_t s = pr.sent % cfg_.nslots;
  if (pr.send_busy[s]) return nullptr;
  return pr.send_mem.data() + s * slot_stride_ + tcp::kPayloadAt;
}

const void* TcpTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  check_peer(peer, "receive");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw_aborted(rank_, reason_);
  const size_t s = pr.received % cfg_.nslots;
  if (!pr.recv_full[s]) return nullptr;
  *hdr = pr.recv_hdr[s];
  if (pr.recv_landed[s] != nullptr) return pr.recv_landed[s];
  return pr.recv_mem.data() + s * slot_stride_ + tcp::kPayloadAt;
}

void TcpTransport::land_recvs(int peer, LandFn land) {
  check_peer(peer, "land_recvs");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  pr.land = std::move(land);
  pr.land_base = pr.received;
}

void TcpTransport::stop_landing(int peer) {
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  pr.land = nullptr;
  for (Conn* c : pr.conns) {
    if (c == nullptr) continue;
    // A recv() into the op's memory returns at once (the socket does not block); after it, the
    // rest of that payload goes to its slot. That only happens when the op ended early (it
    // failed), so its messages are not read any more.
    landing_cv_.wait(lock, [c] { return !c->in_landing_recv; });
    c->landing = nullptr;
  }
}

uint32_t TcpTransport::doorbell() const { return doorbell_.value.load(std::memory_order_seq_cst); }

void TcpTransport::ring_doorbell() { bump(doorbell_); }

void TcpTransport::wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) {
  if (doorbell_.value.load(std::memory_order_acquire) != seen) return;
  sleep_on(doorbell_, std::min<std::chrono::nanoseconds>(at_most, kMaxSleep),
           [seen](uint32_t v) { return v == seen; });
}

void TcpTransport::abort_group(const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = why.empty() ? std::string("aborted") : why;
      first = true;
      for (auto& pr : peers_) {
        if (!pr) continue;
        for (Conn* c : pr->conns) {
          if (c != nullptr && !c->closed) c->ctrl.push_back({tcp::FrameType::Abort, reason_});
        }
      }
    }
  }
  if (!first) return;
  wake_io();
  notify_progress();
  ring_doorbell();
  if (hooks_.on_abort) hooks_.on_abort(why);
  // The I/O thread sends the frames itself once it returns to its loop; any other thread waits
  // for them (flush() notifies cv_ after each frame it writes).
  if (std::this_thread::get_id() == io_.get_id()) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, Clock::now() + kAbortFlushTimeout, [this] {
    for (auto& pr : peers_) {
      if (!pr) continue;
      for (Conn* c : pr->conns) {
        if (c == nullptr || c->closed) continue;
        for (const Conn::Ctrl& f : c->ctrl) {
          if (f.type == tcp::FrameType::Abort) return false;
        }
      }
    }
    return true;
  });
}

void TcpTransport::note_state(uint64_t op_seq, int32_t blocked_on) {
  op_seq_.store(op_seq, std::memory_order_relaxed);
  blocked_on_.store(blocked_on, std::memory_order_relaxed);
}

PeerState TcpTransport::own_state() const {
  PeerState s;
  s.known = true;
  s.op_seq = op_seq_.load(std::memory_order_relaxed);
  s.blocked_on = blocked_on_.load(std::memory_order_relaxed);
  // The I/O thread calls this too, so the other side of a mixed group comes through a hook (whose
  // transport outlives this one), not through the routing transport.
  return hooks_.own_state ? later_of(s, hooks_.own_state()) : s;
}

PeerState TcpTransport::peer_state(int peer, const Deadline& dl) {
  PeerState s;
  if (peer < 0 || peer >= size_ || peer == rank_ || !peers_[peer]) {
    s.unknown = detail::cat("rank ", peer, " is not connected to rank ", rank_, " over TCP");
    return s;
  }
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  Conn* c = nullptr;
  for (Conn* x : pr.conns) {
    if (x != nullptr && !x->closed) {
      c = x;
      break;
    }
  }
  if (c == nullptr) {
    s.unknown = "its connections to this rank are closed";
    return s;
  }
  const uint64_t ticket = ++pr.queries;
  c->ctrl.push_back({tcp::FrameType::Query, {}});
  lock.unlock();
  wake_io();
  lock.lock();
  // Its I/O thread answers, whatever its ranks' own thread is doing; one that does not answer is
  // stopped or starved of CPU.
  const auto start = Clock::now();
  if (!cv_.wait_until(lock, dl.at, [&] { return pr.answers >= ticket || c->closed; }) ||
      pr.answers < ticket) {
    s.unknown = detail::cat("it did not answer a state query within ",
                            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
                            " ms (its process is stopped, starved of CPU, or gone)");
    return s;
  }
  s.known = true;
  s.op_seq = pr.state.op_seq;
  s.blocked_on = pr.state.blocked_on;
  return s;
}

std::string TcpTransport::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_ ? reason_ : std::string();
}

}  // namespace ringreduce
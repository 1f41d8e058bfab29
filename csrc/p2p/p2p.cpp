#include "p2p/p2p.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "common/error.h"
#include "common/failpoint.h"

namespace ringreduce {

namespace {

// Sleep at most this long between looks at the deadlines when nothing rings the doorbell.
constexpr std::chrono::milliseconds kMaxIdle{100};
// After shutdown, how long control messages already queued (refusals, cancels) may wait for a
// slot at a peer that no longer reads them before the engine gives up on them.
constexpr std::chrono::milliseconds kFlushGrace{1000};
// Messages taken from one peer per pass, so one busy peer cannot starve the others.
constexpr int kMaxPerPass = 64;

std::exception_ptr error_of(const std::string& msg) {
  return std::make_exception_ptr(Error(msg));
}

}  // namespace

struct P2p::Request {
  bool is_send = false;
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint8_t dtype = 0;
  int peer = -1;  // -1: a receive from any source
  int tag = 0;
  std::chrono::milliseconds timeout{0};
  Deadline dl;
  Done done;
  uint64_t seq = 0;     // the send's number, in the sender's numbering towards the receiver
  int src = -1;         // a receive: the rank its matched send came from
  uint64_t offset = 0;  // bytes moved so far
  uint64_t posted_at = 0;  // a receive: its place in post order
  uint64_t taken = 0;      // its place in the order the engine took requests (waiting_for)
  bool finished = false;
};

P2p::P2p(Transport& transport, DtypeName dtype_name)
    : t_(transport), dtype_name_(dtype_name), rank_(transport.rank()), size_(transport.size()) {
  peers_.resize(static_cast<size_t>(size_));
}

P2p::~P2p() { shutdown(); }

std::string P2p::describe(const Request& r) const {
  const int peer = r.is_send ? r.peer : (r.src >= 0 ? r.src : r.peer);
  return detail::cat("ringreduce ", r.is_send ? "send to" : "recv from",
                     peer < 0 ? std::string(" any rank") : detail::cat(" rank ", peer), " (tag ",
                     r.tag, ", ", r.bytes, " bytes of ", dtype_name_(r.dtype), ") on rank ", rank_);
}

void P2p::send(const void* data, size_t bytes, uint8_t dtype, int peer, int tag,
               std::chrono::milliseconds timeout, Done done) {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_, "ringreduce send: rank ", rank_,
           " cannot send to rank ", peer, " (group of ", size_, ")");
  // The engine only reads a send's data.
  submit(true, static_cast<uint8_t*>(const_cast<void*>(data)), bytes, dtype, peer, tag, timeout,
         std::move(done));
}

void P2p::recv(void* data, size_t bytes, uint8_t dtype, int peer, int tag,
               std::chrono::milliseconds timeout, Done done) {
  RR_CHECK(peer == -1 || (peer >= 0 && peer < size_ && peer != rank_), "ringreduce recv: rank ",
           rank_, " cannot receive from rank ", peer, " (group of ", size_, ")");
  submit(false, static_cast<uint8_t*>(data), bytes, dtype, peer, tag, timeout, std::move(done));
}

void P2p::submit(bool is_send, uint8_t* data, size_t bytes, uint8_t dtype, int peer, int tag,
                 std::chrono::milliseconds timeout, Done done) {
  auto r = std::make_shared<Request>();
  r->is_send = is_send;
  r->data = data;
  r->bytes = bytes;
  r->dtype = dtype;
  r->peer = peer;
  r->tag = tag;
  r->timeout = timeout;
  r->dl = Deadline::after(timeout);
  r->done = std::move(done);
  std::unique_lock<std::mutex> lock(mu_);
  RR_CHECK(!stopping_, describe(*r), ": the process group was shut down");
  if (!broken_.empty()) {
    const std::string why = broken_;
    lock.unlock();
    r->done(error_of(detail::cat(describe(*r), ": point-to-point is unusable: ", why)), r->peer);
    return;
  }
  new_requests_.push_back(std::move(r));
  start_locked();
  lock.unlock();
  t_.control().ring_doorbell();  // the engine may be asleep
}

void P2p::start_locked() {
  if (!thread_.joinable() && !stopped_) thread_ = std::thread([this] { run(); });
}

void P2p::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  t_.control().ring_doorbell();
  std::lock_guard<std::mutex> join(join_mu_);
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void P2p::cancel(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (broken_.empty()) broken_ = why;
  }
  t_.control().abort_group(why);  // the engine's next transport call throws and it fails everything
  t_.control().ring_doorbell();
  std::lock_guard<std::mutex> join(join_mu_);
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

void P2p::run() {
  // Whatever way the engine ends, it waits for nobody after it (a peer's chain must not stop here).
  struct Unnote {
    P2p* p;
    ~Unnote() {
      if (p->noted_ != -1) p->t_.control().note_state(1, -1);
    }
  } unnote{this};
  Deadline flush_by = Deadline::never();
  for (;;) {
    const uint32_t seen = t_.control().doorbell();
    bool moved = false;
    try {
      moved = step();
    } catch (const std::exception& e) {
      std::string why = t_.control().abort_reason();
      if (why.empty()) {
        why = detail::cat("rank ", rank_, ": ", e.what());
        t_.control().abort_group(why);
      }
      fail_all(why);
      return;
    }
    if (draining_ && !busy()) {
      bool flushed = true;
      for (const Peer& p : peers_) flushed = flushed && p.control.empty();
      if (flushed) return;
      if (flush_by.at == Clock::time_point::max()) flush_by = Deadline::after(kFlushGrace);
      if (flush_by.passed()) return;
    }
    note_waiting();
    if (!moved) t_.control().wait_doorbell(seen, next_wake());
  }
}

int P2p::waiting_for() const {
  uint64_t oldest = UINT64_MAX;
  int who = -1;
  auto consider = [&](const Req& r, int peer) {
    if (peer >= 0 && r->taken < oldest) {
      oldest = r->taken;
      who = peer;
    }
  };
  for (const Req& r : posted_) consider(r, r->peer);
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[p];
    for (const auto& kv : peer.awaiting_clear) consider(kv.second, p);
    for (const Req& r : peer.incoming) consider(r, p);
    for (const Req& r : peer.streaming) consider(r, p);
  }
  return who;
}

void P2p::note_waiting() {
  const int now = waiting_for();
  if (now == noted_) return;
  noted_ = now;
  t_.control().note_state(1, now);
}

std::string P2p::held_up_by(int peer, const Deadline& walk) {
  std::string path = detail::cat("rank ", peer);
  int q = peer;
  for (int hops = 0; hops < size_; ++hops) {
    const PeerState s = t_.control().peer_state(q, walk);
    if (s.stopped) {
      return detail::cat(": ", path, q == peer ? " is" : ", which is",
                         " stopped (its process is in state T: SIGSTOP, or a debugger)");
    }
    if (!s.known) return q == peer ? "" : detail::cat(": ", path, ", whose state is unknown: ", s.unknown);
    const int next = s.blocked_on;
    if (next == rank_) {
      return detail::cat(": ", path, q == peer ? " waits" : ", which waits", " for this rank in turn");
    }
    if (next < 0 || next >= size_ || next == q) {
      return q == peer ? "" : detail::cat(": ", path, ", which waits for no other rank");
    }
    path += detail::cat(q == peer ? " waits for rank " : ", which waits for rank ", next);
    q = next;
  }
  return detail::cat(": ", path, " (every rank of the chain waits for another)");
}

bool P2p::busy() const {
  for (const Peer& p : peers_) {
    if (!p.streaming.empty() || !p.incoming.empty()) return true;
  }
  return false;
}

std::chrono::nanoseconds P2p::next_wake() const {
  std::chrono::nanoseconds wake = kMaxIdle;
  auto consider = [&wake](const Req& r) { wake = std::min(wake, r->dl.remaining()); };
  for (const Req& r : posted_) consider(r);
  for (const Peer& p : peers_) {
    for (const auto& kv : p.awaiting_clear) consider(kv.second);
    for (const Req& r : p.streaming) consider(r);
    for (const Req& r : p.incoming) consider(r);
  }
  return wake;
}

bool P2p::step() {
  bool moved = false;
  // Messages first: what a peer published before this rank posted a receive (a Cancel, say)
  // is then known when the receive is matched.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    moved = drain_peer(p) || moved;
  }
  take_new_requests();
  moved = check_deadlines() || moved;
  moved = check_peers() || moved;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    moved = feed_peer(p) || moved;
  }
  return moved;
}

void P2p::take_new_requests() {
  std::deque<Req> fresh;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(new_requests_);
    stopping = stopping_;
  }
  for (const Req& r : fresh) {
    r->taken = taken_++;
    if (r->is_send) {
      Peer& peer = peers_[r->peer];
      r->seq = peer.next_seq++;
      peer.control.push_back({OpKind::P2pReady, r->seq, r->bytes, r->tag, r->dtype});
      peer.awaiting_clear.emplace(r->seq, r);
    } else {
      r->posted_at = posts_++;
      post_recv(r);
    }
  }
  if (stopping && !draining_) {
    // Shutdown: what is matched runs to its end; nothing new gets matched.
    draining_ = true;
    const std::string why = "the process group was shut down before this was matched";
    for (const Req& r : posted_) finish(r, error_of(detail::cat(describe(*r), ": ", why)));
    posted_.clear();
    for (Peer& peer : peers_) {
      for (auto& kv : peer.awaiting_clear) {
        peer.control.push_back({OpKind::P2pCancel, kv.first, 0, kv.second->tag, 0});
        finish(kv.second, error_of(detail::cat(describe(*kv.second), ": ", why)));
      }
      peer.awaiting_clear.clear();
      for (const Ready& rd : peer.unmatched) {
        peer.control.push_back({OpKind::P2pRefuse, rd.seq, 0, rd.tag, 0});
      }
      peer.unmatched.clear();
    }
  }
}

void P2p::post_recv(const Req& r) {
  // The earliest-arrived send that fits; sends from one peer keep that peer's order.
  Peer* best = nullptr;
  std::deque<Ready>::iterator best_it;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || (r->peer >= 0 && p != r->peer)) continue;
    Peer& peer = peers_[p];
    auto it = std::find_if(peer.unmatched.begin(), peer.unmatched.end(),
                           [&r](const Ready& rd) { return rd.tag == r->tag; });
    if (it != peer.unmatched.end() && (best == nullptr || it->arrival < best_it->arrival)) {
      best = &peer;
      best_it = it;
    }
  }
  if (best == nullptr) {
    // In post order: a receive put back after its send was withdrawn keeps its place.
    auto at = std::find_if(posted_.begin(), posted_.end(),
                           [&r](const Req& q) { return q->posted_at > r->posted_at; });
    posted_.insert(at, r);
    return;
  }
  const Ready rd = *best_it;
  best->unmatched.erase(best_it);
  grant(r, rd);
}

void P2p::grant(const Req& r, const Ready& rd) {
  r->src = rd.src;
  r->seq = rd.seq;
  Peer& peer = peers_[rd.src];
  // The sender compares the same two fields and fails its side; no data moves.
  peer.control.push_back({OpKind::P2pClear, rd.seq, r->bytes, r->tag, r->dtype});
  if (rd.bytes != r->bytes || rd.dtype != r->dtype) {
    finish(r, error_of(detail::cat(describe(*r), ": the matching send from rank ", rd.src, " has ",
                                   rd.bytes, " bytes of ", dtype_name_(rd.dtype),
                                   "; sizes and dtypes of a send and its recv must agree")));
    return;
  }
  if (r->bytes == 0) {
    finish(r, nullptr);
    return;
  }
  peer.incoming.push_back(r);
}

bool P2p::drain_peer(int p) {
  bool moved = false;
  MsgHeader h;
  for (int i = 0; i < kMaxPerPass; ++i) {
    const void* payload = t_.try_recv_begin(p, &h);
    if (payload == nullptr) break;
    on_message(p, h, payload);
    t_.recv_end(p);
    moved = true;
  }
  return moved;
}

void P2p::on_message(int p, const MsgHeader& h, const void* payload) {
  Peer& peer = peers_[p];
  switch (static_cast<OpKind>(h.kind)) {
    case OpKind::P2pReady: {
      RR_CHECK(h.bytes == sizeof(int64_t), "rank ", rank_, ": malformed point-to-point message from rank ", p);
      int64_t tag;
      std::memcpy(&tag, payload, sizeof tag);
      Ready rd{p, h.seq, h.count, static_cast<int>(tag), h.dtype, arrivals_++};
      if (draining_) {
        peer.control.push_back({OpKind::P2pRefuse, rd.seq, 0, rd.tag, 0});
        return;
      }
      auto it = std::find_if(posted_.begin(), posted_.end(), [&rd](const Req& r) {
        return (r->peer < 0 || r->peer == rd.src) && r->tag == rd.tag;
      });
      if (it == posted_.end()) {
        peer.unmatched.push_back(rd);
        return;
      }
      const Req r = *it;
      posted_.erase(it);
      grant(r, rd);
      return;
    }
    case OpKind::P2pClear: {
      auto it = peer.awaiting_clear.find(h.seq);
      if (it == peer.awaiting_clear.end()) return;  // given up: our Cancel is on its way
      const Req r = it->second;
      peer.awaiting_clear.erase(it);
      if (h.count != r->bytes || h.dtype != r->dtype) {
        finish(r, error_of(detail::cat(describe(*r), ": the matching recv on rank ", p, " has ",
                                       h.count, " bytes of ", dtype_name_(h.dtype),
                                       "; sizes and dtypes of a send and its recv must agree")));
      } else if (r->bytes == 0) {
        finish(r, nullptr);
      } else {
        peer.streaming.push_back(r);
      }
      return;
    }
    case OpKind::P2pData: {
      RR_CHECK(!peer.incoming.empty(), "rank ", rank_,
               ": point-to-point data from rank ", p, " that no recv was matched to");
      const Req r = peer.incoming.front();
      RR_CHECK(h.seq == r->seq && h.count == r->offset && h.bytes <= r->bytes - r->offset &&
                   h.bytes > 0,
               "rank ", rank_, ": point-to-point data from rank ", p,
               " out of order (send #", h.seq, " at offset ", h.count, ", expected send #", r->seq,
               " at offset ", r->offset, ")");
      std::memcpy(r->data + r->offset, payload, h.bytes);
      r->offset += h.bytes;
      if (r->offset == r->bytes) {
        peer.incoming.pop_front();
        finish(r, nullptr);
      }
      return;
    }
    case OpKind::P2pRefuse: {
      auto it = peer.awaiting_clear.find(h.seq);
      if (it == peer.awaiting_clear.end()) return;
      const Req r = it->second;
      peer.awaiting_clear.erase(it);
      finish(r, error_of(detail::cat(describe(*r), ": rank ", p,
                                     " shut its process group down before posting a matching recv")));
      return;
    }
    case OpKind::P2pCancel: {
      auto un = std::find_if(peer.unmatched.begin(), peer.unmatched.end(),
                             [&h](const Ready& rd) { return rd.seq == h.seq; });
      if (un != peer.unmatched.end()) {
        peer.unmatched.erase(un);
        return;
      }
      auto in = std::find_if(peer.incoming.begin(), peer.incoming.end(),
                             [&h](const Req& r) { return r->seq == h.seq; });
      if (in != peer.incoming.end()) {
        // The send was withdrawn (it timed out, or its group shut down) after this receive
        // matched it and before any data came: the receive waits for another send.
        const Req r = *in;
        peer.incoming.erase(in);
        r->src = -1;
        r->seq = 0;
        post_recv(r);
      }
      return;
    }
    default:
      RR_CHECK(false, "rank ", rank_, ": unexpected message kind ", h.kind,
               " on the point-to-point channel from rank ", p);
  }
}

bool P2p::feed_peer(int p) {
  Peer& peer = peers_[p];
  bool moved = false;
  while (!peer.control.empty()) {
    void* slot = t_.try_send_begin(p);
    if (slot == nullptr) return moved;
    const Control c = peer.control.front();
    MsgHeader h;
    h.seq = c.seq;
    h.count = c.count;
    h.kind = static_cast<uint16_t>(c.kind);
    h.dtype = c.dtype;
    if (c.kind == OpKind::P2pReady) {
      const int64_t tag = c.tag;
      std::memcpy(slot, &tag, sizeof tag);
      h.bytes = sizeof tag;
    }
    t_.send_end(p, h);
    peer.control.pop_front();
    moved = true;
  }
  // Data only behind an empty control queue: a Cancel then always overtakes nothing it refers to.
  const size_t chunk = t_.max_payload();
  while (!peer.streaming.empty()) {
    const Req r = peer.streaming.front();
    void* slot = t_.try_send_begin(p);
    if (slot == nullptr) break;
    const uint64_t n = std::min<uint64_t>(chunk, r->bytes - r->offset);
    std::memcpy(slot, r->data + r->offset, n);
    MsgHeader h;
    h.seq = r->seq;
    h.count = r->offset;
    h.bytes = n;
    h.kind = static_cast<uint16_t>(OpKind::P2pData);
    h.dtype = r->dtype;
    t_.send_end(p, h);
    r->offset += n;
    moved = true;
    if (r->offset < r->bytes) failpoint("p2p.send_data", rank_);  // part of the data sent
    if (r->offset == r->bytes) {
      peer.streaming.pop_front();
      finish(r, nullptr);
    }
  }
  return moved;
}

bool P2p::check_deadlines() {
  // Requests that timed out before they were matched, each with the peer it waited for (-1: any)
  // and what its error says so far; they fail after the transfers in flight were checked.
  std::vector<std::tuple<Req, int, std::string>> expired;
  for (auto it = posted_.begin(); it != posted_.end();) {
    if (!(*it)->dl.passed()) {
      ++it;
      continue;
    }
    const Req r = *it;
    it = posted_.erase(it);
    expired.emplace_back(r, r->peer, detail::cat(describe(*r), ": Timed out after ", r->timeout.count(),
                                                 " ms: no matching send arrived"));
  }
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[p];
    for (auto it = peer.awaiting_clear.begin(); it != peer.awaiting_clear.end();) {
      if (!it->second->dl.passed()) {
        ++it;
        continue;
      }
      const Req r = it->second;
      peer.control.push_back({OpKind::P2pCancel, r->seq, 0, r->tag, 0});
      it = peer.awaiting_clear.erase(it);
      expired.emplace_back(r, p, detail::cat(describe(*r), ": Timed out after ", r->timeout.count(),
                                             " ms: rank ", p, " posted no matching recv"));
    }
    // A matched transfer that runs out of time stopped halfway: its peer is gone or stuck, and
    // the two sides no longer agree on the channel's state.
    auto late = [](const Req& r) { return r->dl.passed(); };
    auto s = std::find_if(peer.streaming.begin(), peer.streaming.end(), late);
    auto i = std::find_if(peer.incoming.begin(), peer.incoming.end(), late);
    const Req* stuck = s != peer.streaming.end() ? &*s : i != peer.incoming.end() ? &*i : nullptr;
    if (stuck != nullptr) {
      const Request& r = **stuck;
      const std::string why = detail::cat(
          describe(r), ": Timed out after ", r.timeout.count(), " ms with ", r.offset, " of ",
          r.bytes, " bytes moved: rank ", p, " stopped in the middle of the transfer");
      for (auto& e : expired) finish(std::get<0>(e), std::make_exception_ptr(TimeoutError(std::get<2>(e))));
      t_.control().abort_group(why);
      throw TimeoutError(why);
    }
  }
  // Where the chain of waits from each peer ends, asked once per peer and within one budget. Not
  // while a transfer streams: a peer that does not answer would hold the engine for the whole
  // budget, and that transfer's own deadline with it.
  const bool walk = !busy();
  const Deadline budget = Deadline::after(kChainBudget);
  std::map<int, std::string> chain;
  for (auto& [r, peer, what] : expired) {
    if (walk && peer >= 0 && chain.find(peer) == chain.end()) chain[peer] = held_up_by(peer, budget);
    finish(r, std::make_exception_ptr(TimeoutError(walk && peer >= 0 ? what + chain[peer] : what)));
  }
  return !expired.empty();
}

bool P2p::check_peers() {
  if (!liveness_due_.passed()) return false;
  liveness_due_ = Deadline::after(kMaxIdle);
  bool waiting = !posted_.empty();
  for (const Peer& peer : peers_) {
    waiting = waiting || !peer.awaiting_clear.empty() || !peer.streaming.empty() || !peer.incoming.empty();
  }
  if (!waiting) return false;
  std::vector<std::string> lost(static_cast<size_t>(size_));
  int alive = 0;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    lost[p] = t_.control().peer_lost(p);
    alive += lost[p].empty();
  }
  bool changed = false;
  auto gone = [&](const Request& r, int p) {
    return error_of(detail::cat(describe(r), ": rank ", p, " is gone: ", lost[p]));
  };
  for (int p = 0; p < size_; ++p) {
    if (lost[p].empty()) continue;
    Peer& peer = peers_[p];
    const Req* cut = !peer.streaming.empty() ? &peer.streaming.front()
                     : !peer.incoming.empty() ? &peer.incoming.front() : nullptr;
    if (cut != nullptr) {
      const std::string why = detail::cat(describe(**cut), ": rank ", p, " died in the middle of ",
                                          "the transfer (", (*cut)->offset, " of ", (*cut)->bytes,
                                          " bytes moved): ", lost[p]);
      t_.control().abort_group(why);
      throw Error(why);
    }
    for (auto& kv : peer.awaiting_clear) finish(kv.second, gone(*kv.second, p));
    changed = changed || !peer.awaiting_clear.empty();
    peer.awaiting_clear.clear();
  }
  for (auto it = posted_.begin(); it != posted_.end();) {
    const Req r = *it;
    const bool from_dead = r->peer >= 0 ? !lost[r->peer].empty() : alive == 0;
    if (!from_dead) {
      ++it;
      continue;
    }
    it = posted_.erase(it);
    changed = true;
    finish(r, r->peer >= 0 ? gone(*r, r->peer)
                           : error_of(detail::cat(describe(*r), ": every other rank is gone")));
  }
  return changed;
}

void P2p::finish(const Req& r, std::exception_ptr error) {
  if (r->finished) return;
  r->finished = true;
  Done done = std::move(r->done);
  const int source = r->is_send ? r->peer : r->src;
  done(error, source);
}

void P2p::fail_all(const std::string& why) {
  std::deque<Req> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.empty()) broken_ = why;
    fresh.swap(new_requests_);
  }
  auto fail = [this, &why](const Req& r) {
    finish(r, std::make_exception_ptr(AbortedError(
                  detail::cat(describe(*r), ": point-to-point was aborted: ", why))));
  };
  for (const Req& r : fresh) fail(r);
  for (const Req& r : posted_) fail(r);
  posted_.clear();
  for (Peer& peer : peers_) {
    for (auto& kv : peer.awaiting_clear) fail(kv.second);
    for (const Req& r : peer.streaming) fail(r);
    for (const Req& r : peer.incoming) fail(r);
    peer = Peer{};
  }
}

}  // namespace ringreduce

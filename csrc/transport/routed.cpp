#include "transport/routed.h"

#include <algorithm>

#include "common/error.h"

namespace ringreduce {

RoutedTransport::RoutedTransport(int rank, int size, std::vector<Transport*> rows,
                                 std::vector<int8_t> route)
    : rank_(rank), size_(size), route_(std::move(route)) {
  RR_CHECK(route_.size() == static_cast<size_t>(size), "ringreduce: ", route_.size(),
           " routes for a group of ", size);
  RR_CHECK(!rows.empty() && rows[0] != nullptr, "ringreduce: a routed group without its control");
  // Only the rows in use, so that every call over all of them touches no idle one; route_ is
  // renumbered to match.
  std::vector<int8_t> index(rows.size(), -1);
  for (size_t i = 0; i < rows.size(); ++i) {
    const bool used = i == 0 || std::find(route_.begin(), route_.end(), static_cast<int8_t>(i)) != route_.end();
    if (!used) continue;
    RR_CHECK(rows[i] != nullptr, "ringreduce: rank ", rank, " routes peers to transport ", i,
             ", which was not made");
    index[i] = static_cast<int8_t>(rows_.size());
    rows_.push_back(rows[i]);
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    RR_CHECK(route_[p] >= 0 && static_cast<size_t>(route_[p]) < rows.size(), "ringreduce: rank ",
             rank, " has no transport to rank ", p);
    route_[p] = index[static_cast<size_t>(route_[p])];
  }
  for (Transport* t : rows_) t->follow_chains_through(this);
}

size_t RoutedTransport::max_payload() const {
  size_t m = rows_[0]->max_payload();
  for (const Transport* t : rows_) m = std::min(m, t->max_payload());
  return m;
}

Transport& RoutedTransport::to(int peer) const {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_, "ringreduce: rank ", rank_,
           " names invalid peer ", peer, " (world size ", size_, ")");
  return *rows_[static_cast<size_t>(route_[peer])];
}

void RoutedTransport::cross_abort() {
  const std::string why = abort_reason();
  if (why.empty()) return;
  for (Transport* t : rows_) t->control().abort_group(why);  // the first reason a row recorded stays
}

// Every blocking call: an error from one row is the whole group's.
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

// The other rows ring the control's doorbell (TcpHooks::beside), so one doorbell covers all.
uint32_t RoutedTransport::doorbell() const { return rows_[0]->control().doorbell(); }

void RoutedTransport::ring_doorbell() { rows_[0]->control().ring_doorbell(); }

void RoutedTransport::wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) {
  rows_[0]->control().wait_doorbell(seen, at_most);
}

void RoutedTransport::abort_group(const std::string& why) {
  for (Transport* t : rows_) t->control().abort_group(why);
}

std::string RoutedTransport::abort_reason() const {
  for (const Transport* t : rows_) {
    std::string r = t->control().abort_reason();
    if (!r.empty()) return r;
  }
  return "";
}

void RoutedTransport::note_state(uint64_t op_seq, int32_t blocked_on) {
  for (Transport* t : rows_) t->control().note_state(op_seq, blocked_on);
}

PeerState RoutedTransport::own_state() const {
  PeerState s = rows_[0]->control().own_state();
  for (size_t i = 1; i < rows_.size(); ++i) s = later_of(rows_[i]->control().own_state(), s);
  return s;
}

PeerState RoutedTransport::peer_state(int peer, const Deadline& dl) {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    PeerState s;
    s.unknown = detail::cat("rank ", peer, " is not a peer of rank ", rank_);
    return s;
  }
  return to(peer).control().peer_state(peer, dl);
}

std::string RoutedTransport::peer_lost(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return "";
  return to(peer).control().peer_lost(peer);
}

}  // namespace ringreduce

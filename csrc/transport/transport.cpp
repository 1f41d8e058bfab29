#include "transport/transport.h"

#include "common/algos.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "common/dtype.h"
#include "common/error.h"

namespace ringreduce {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Allreduce: return "allreduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Barrier: return "barrier";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllGather: return "allgather";
    case OpKind::Reduce: return "reduce";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::AllToAll: return "alltoall";
    case OpKind::P2pReady: return "p2p ready";
    case OpKind::P2pClear: return "p2p clear";
    case OpKind::P2pData: return "p2p data";
    case OpKind::P2pRefuse: return "p2p refuse";
    case OpKind::P2pCancel: return "p2p cancel";
  }
  return "unknown op";
}

PeerState later_of(const PeerState& a, const PeerState& b) {
  if (a.op_seq != b.op_seq) return a.op_seq > b.op_seq ? a : b;
  return a.blocked_on >= 0 ? a : b;
}

std::string follow_waits(Transport& view, int peer, const OpContext& op) {
  const int self = view.rank(), size = view.size();
  const Deadline walk = Deadline::after(kChainBudget);
  int p = peer;
  uint64_t seq = op.seq;  // the op the rank at hand is expected in
  for (int hops = 0; hops < size; ++hops) {
    const PeerState s = view.control().peer_state(p, walk);
    if (!s.known) return detail::cat("the state of rank ", p, " is unknown: ", s.unknown);
    if (s.stopped) {
      return detail::cat("rank ", p, " is stopped (its process is in state T: SIGSTOP, or a ",
                         "debugger) in op #", s.op_seq == 0 ? 0 : s.op_seq - 1);
    }
    const uint64_t at = s.op_seq;
    const std::string which = seq == op.seq ? std::string("this op") : detail::cat("op #", seq);
    // One op behind and waiting there is no absence either: the rank at hand finished its part of
    // op k-1 (a broadcast's root, say) and went on, while this one still waits in op k-1 for
    // another. Follow it there.
    if (at == seq && seq > 0 && s.blocked_on >= 0 && s.blocked_on != self && s.blocked_on < size) {
      seq = at - 1;
      p = s.blocked_on;
      continue;
    }
    if (at < seq + 1) {
      return at == 0 ? detail::cat("rank ", p, " has not arrived at ", which, " (it has run no op yet)")
                     : detail::cat("rank ", p, " has not arrived at ", which,
                                   " (the last op it reached is #", at - 1, ")");
    }
    // One op ahead is no desync: a rank that has sent and received all it needed of op k goes on
    // to op k+1, and may wait there for a rank still in op k. Follow it there.
    if (at > seq + 2) {
      return detail::cat("rank ", p, " is already at op #", at - 1,
                         ": the ranks did not issue the same ops");
    }
    const int next = s.blocked_on;
    if (next < 0 || next == self || next >= size) {
      return detail::cat("rank ", p, " is in ", at - 1 == op.seq ? std::string("this op") : detail::cat("op #", at - 1),
                         " but makes no progress");
    }
    seq = at - 1;
    p = next;
  }
  return "every rank of the chain is waiting for another";
}

std::string incarnation_prefix(Bootstrap& bs, int rank, int size,
                               std::chrono::milliseconds timeout) {
  // A store may outlive a failed attempt of the job (torchrun's agent keeps its TCPStore, and so
  // may any launcher), and torch gives the new attempt's group the same name: keys the dead
  // attempt left must not be read, whichever point of set-up its ranks died at. Counting ranks in
  // (n ranks draw n numbers) cannot tell a dead attempt's partial count from a new one, so rank 0
  // draws a random id for this incarnation and hands it to each rank in answer to a random nonce
  // of that rank's own: an answer keyed by a fresh nonce cannot be stale. Rank 0 answers whatever
  // nonce it finds under a rank's key (a dead attempt's too, harmlessly) until that rank
  // confirms under the new id.
  std::random_device rd;
  auto draw = [&rd] {
    char id[17];
    std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
    return std::string(id);
  };
  const std::string base = "ringreduce/join/";
  if (rank != 0) {
    const std::string nonce = draw();
    bs.set(detail::cat(base, rank), nonce);
    const std::string id = bs.get(detail::cat(base, rank, "/", nonce));
    bs.add(detail::cat(base, id, "/", rank), 1);
    return "ringreduce/" + id + "/";
  }
  const std::string id = draw();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < size; ++r) {
    const std::string joined = detail::cat(base, id, "/", r);
    auto pause = std::chrono::microseconds(100);
    for (;;) {
      const std::string nonce = bs.get(detail::cat(base, r));  // waits until rank r has written
      bs.set(detail::cat(base, r, "/", nonce), id);
      if (bs.add(joined, 0) > 0) break;
      // What it found was a dead attempt's nonce, or rank r has not read the answer yet.
      RR_CHECK(std::chrono::steady_clock::now() < deadline, "ringreduce: rank 0: rank ", r,
               " did not join the group's set-up within ", timeout.count(), " ms");
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }
  return "ringreduce/" + id + "/";
}

std::string describe_op(const MsgHeader& h) {
  if (h.kind == 0 && h.seq == 0 && h.count == 0) return "an empty message";
  std::string s = detail::cat(op_kind_name(static_cast<OpKind>(h.kind)), " #", h.seq, " of ",
                              h.count, " ", dtype_name(static_cast<DType>(h.dtype)));
  const auto kind = static_cast<OpKind>(h.kind);
  if (kind == OpKind::Allreduce || kind == OpKind::ReduceScatter || kind == OpKind::Reduce) {
    s += detail::cat(" (", redop_name(static_cast<RedOp>(h.redop & 0x7f)),
                     (h.redop & 0x80) ? ", averaged" : "", ")");
  }
  if (h.root >= 0) s += detail::cat(" from root ", h.root);
  // The ring is what carries an op unless the header says otherwise.
  const auto a = static_cast<Algo>(h.algo);
  if (a != Algo::Auto && a != Algo::Ring) s += detail::cat(" by ", algo_name(a));
  return s;
}

bool same_op(const MsgHeader& a, const MsgHeader& b) {
  return a.seq == b.seq && a.kind == b.kind && a.algo == b.algo && a.count == b.count &&
         a.dtype == b.dtype && a.redop == b.redop && a.root == b.root;
}

}  // namespace ringreduce

#include "transport/transport.h"

#include <cstdlib>
#include <string>

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
  for (int hops = 0; hops < size; ++hops) {
    const PeerState s = view.peer_state(p, walk);
    if (!s.known) return detail::cat("the state of rank ", p, " is unknown: ", s.unknown);
    const uint64_t at = s.op_seq;
    if (at < op.seq + 1) {
      return at == 0 ? detail::cat("rank ", p, " has not arrived at this op (it has run no op yet)")
                     : detail::cat("rank ", p, " has not arrived at this op (the last op it reached is #",
                                   at - 1, ")");
    }
    if (at > op.seq + 1) {
      return detail::cat("rank ", p, " is already at op #", at - 1,
                         ": the ranks did not issue the same ops");
    }
    const int next = s.blocked_on;
    if (next < 0 || next == self || next >= size) {
      return detail::cat("rank ", p, " is in this op but makes no progress");
    }
    p = next;
  }
  return "every rank of the chain is waiting for another";
}

std::string incarnation_prefix(Bootstrap& bs, int size) {
  // torchrun's store outlives a failed attempt of the job, and a rank that died inside set-up
  // drew its number (or did not) there: counting on across attempts would hand the next attempt's
  // ranks numbers of different incarnations, and they would wait for each other forever. So each
  // attempt (TORCHELASTIC_RESTART_COUNT, the same on every rank of it) counts its own.
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const std::string attempt = restart != nullptr && *restart != '\0' ? restart : "0";
  // The n ranks of one incarnation draw n consecutive numbers; a later incarnation only starts
  // once every rank has left the earlier one, so it draws the next n.
  const int64_t v = bs.add("ringreduce/incarnation/" + attempt, 1);
  return "ringreduce/" + attempt + "/" + std::to_string((v - 1) / size) + "/";
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
  return s;
}

bool same_op(const MsgHeader& a, const MsgHeader& b) {
  return a.seq == b.seq && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
         a.redop == b.redop && a.root == b.root;
}

}  // namespace ringreduce

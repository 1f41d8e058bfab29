#include "transport/transport.h"

#include <string>

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

std::string incarnation_prefix(Bootstrap& bs, int size) {
  // The n ranks of one incarnation draw n consecutive numbers; a later incarnation only starts
  // once every rank has left the earlier one, so it draws the next n.
  const int64_t v = bs.add("ringreduce/incarnation", 1);
  return "ringreduce/" + std::to_string((v - 1) / size) + "/";
}

}  // namespace ringreduce

#include "transport/transport.h"

namespace ringreduce {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Allreduce: return "allreduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Barrier: return "barrier";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllGather: return "allgather";
  }
  return "unknown op";
}

}  // namespace ringreduce

// The chain: broadcast as a pipelined chain along the ring from the root.
#pragma once

#include "algo/messages.h"

namespace ringreduce {

class Chain : MessageAlgorithm {
 public:
  // `m` outlives this.
  explicit Chain(Messages& m) : MessageAlgorithm(m) {}

  // buf on `root` is copied into buf on every other rank: each slice is forwarded before it is
  // copied out, so every link carries the message once.
  void broadcast(void* buf, size_t count, DType t, int root, const OpContext& ctx,
                 const Deadline& dl);
};

}  // namespace ringreduce

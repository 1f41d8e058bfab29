// Pairwise exchanges: all-to-all, each pair of ranks in turn.
#pragma once

#include <vector>

#include "algo/messages.h"

namespace ringreduce {

class Pairwise : MessageAlgorithm {
 public:
  // `m` outlives this.
  explicit Pairwise(Messages& m) : MessageAlgorithm(m) {}

  // Rank r sends send_counts[p] elements from `in` chunk p to every rank p, and receives
  // recv_counts[p] elements from rank p into `out` chunk p. The counts must agree pairwise
  // (rank r's send_counts[p] is rank p's recv_counts[r]): a mismatch fails on both.
  void alltoall(const Chunks& in, const std::vector<size_t>& send_counts, const Chunks& out,
                const std::vector<size_t>& recv_counts, DType t, const OpContext& ctx,
                const Deadline& dl);
};

}  // namespace ringreduce

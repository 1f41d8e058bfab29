// The star: gather and scatter, every rank straight to or from the root.
#pragma once

#include "algo/messages.h"

namespace ringreduce {

class Star : MessageAlgorithm {
 public:
  // `m` outlives this.
  explicit Star(Messages& m) : MessageAlgorithm(m) {}

  // Chunk r of `out` on `root` = rank r's `in` (count elements). `out` is only used on the root.
  void gather(const void* in, const Chunks& out, size_t count, DType t, int root,
              const OpContext& ctx, const Deadline& dl);
  // `out` on rank r = chunk r of `in` on `root` (count elements). `in` is only used on the root.
  void scatter(const Chunks& in, void* out, size_t count, DType t, int root, const OpContext& ctx,
               const Deadline& dl);
};

}  // namespace ringreduce

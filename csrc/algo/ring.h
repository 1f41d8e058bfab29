// The ring: all-reduce, reduce-scatter, all-gather, reduce and barrier over messages.
//
// All-reduce is the textbook ring: a reduce-scatter (n-1 steps) leaves each rank with one fully
// reduced chunk, and an all-gather (n-1 steps) passes those chunks around until every rank has all
// of them. Each chunk is cut into slices of at most one transport slot, and the whole ring is run
// once per slice index; because a FIFO link holds several slots, a rank may be several slices ahead
// of its successor, so while one slice is being reduced the next ones are already in flight.
#pragma once

#include "algo/messages.h"

namespace ringreduce {

class Ring : MessageAlgorithm {
 public:
  // `m` outlives this.
  explicit Ring(Messages& m) : MessageAlgorithm(m) {}

  // out = in[rank 0] op in[rank 1] op ... (count elements of type t on every rank), then divided
  // by `divisor` when it is not 1 (AVG). `in` may equal `out`; otherwise they must not overlap.
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 const OpContext& ctx, const Deadline& dl);
  // out (count elements) = chunk `rank` of the element-wise reduction of every rank's `in`, whose n
  // chunks of `count` elements each are given by `in`; divided by `divisor` when it is not 1. out
  // must not overlap the chunks.
  void reduce_scatter(const Chunks& in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                      const OpContext& ctx, const Deadline& dl);
  // Chunk r of `out` (count elements each) = rank r's `in`, on every rank. `in` may be out's
  // chunk `rank` itself.
  void all_gather(const void* in, const Chunks& out, size_t count, DType t, const OpContext& ctx,
                  const Deadline& dl);
  // out on `root` = the reduction of every rank's `in` (count elements), divided by `divisor` when
  // it is not 1; `out` is only used on the root (it may equal `in` there). A reduce-scatter whose
  // last step sends each finished chunk to the root instead of around the ring.
  void reduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
              int root, const OpContext& ctx, const Deadline& dl);
  // Returns once every rank of the group has entered the barrier (Messages::round).
  void barrier(const OpContext& ctx, const Deadline& dl);

  // For algorithms that compose rings (hierarchical.h), whose messages all carry the fingerprint
  // `fp` of the op the caller is in, so that a desync names that op:
  //
  // The all-reduce above.
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 const MsgHeader& fp, const OpContext& ctx, const Deadline& dl);
  // Its first half: of `out` cut as the all-reduce cuts `count` elements (n chunks of
  // ceil(count/n), the last ones shorter or empty), this rank's chunk rank() = that chunk of the
  // reduction of every rank's `in` (divided by `divisor` when it is not 1); the other chunks are
  // left as they are. `in` may equal `out`.
  void reduce_scatter_part(const void* in, void* out, size_t count, DType t, RedOp op,
                           int64_t divisor, const MsgHeader& fp, const OpContext& ctx,
                           const Deadline& dl);
  // Its second half: every rank's chunk rank() of `buf` (cut the same way) is copied into the
  // same place of `buf` on every other rank.
  void all_gather_part(void* buf, size_t count, DType t, const MsgHeader& fp, const OpContext& ctx,
                       const Deadline& dl);

 private:
  // The reduce-scatter of slice j: steps 0..n-2 pass partial sums along the ring, each rank adding
  // its own input; at the last step rank r receives the sum of every other rank's input for its
  // own chunk r and calls finish(span, received partial, its own input) to complete it.
  template <class Finish>
  void reduce_scatter_slice(const Plan& p, size_t j, const Chunks& in, DType t, RedOp op,
                            const MsgHeader& fp, const OpContext& ctx, const Deadline& dl,
                            Finish&& finish);
  // The all-gather of slice j, once rank r has sent its own chunk r: receives the other n-1
  // chunks into `out`, forwarding each but the last.
  void all_gather_slice(const Plan& p, size_t j, const Chunks& out, const MsgHeader& fp,
                        const OpContext& ctx, const Deadline& dl);
  // Where the all-gather message of slice j at step s (1..n-1) goes in `out`, for a transport
  // that lands receives in place (Transport::land_recvs): null unless `got` is exactly the header
  // that message must carry. Called on the transport's thread; reads only the op's constants.
  void* landing_spot(const Plan& p, size_t j, int s, const Chunks& out, const MsgHeader& fp,
                     const MsgHeader& got) const;
};

}  // namespace ringreduce

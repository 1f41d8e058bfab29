// The ring algorithms, written once against the Transport primitives.
//
// All-reduce is the textbook ring: a reduce-scatter (n-1 steps) leaves each rank with one fully
// reduced chunk, and an all-gather (n-1 steps) passes those chunks around until every rank has all
// of them. Each chunk is cut into slices of at most one transport slot, and the whole ring is run
// once per slice index; because a FIFO link holds several slots, a rank may be several slices ahead
// of its successor, so while one slice is being reduced the next ones are already in flight.
//
// The ring never asks which transport carries a message, and the reduction order is fixed by
// rank positions alone, so every rank ends with the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/deadline.h"
#include "common/dtype.h"
#include "transport/transport.h"

namespace ringreduce {

class Ring {
 public:
  // slice_bytes: the most a single message carries (clamped to the transport's slot size).
  Ring(Transport& transport, size_t slice_bytes);

  // out = in[rank 0] op in[rank 1] op ... (count elements of type t on every rank), then divided
  // by `divisor` when it is not 1 (AVG). `in` may equal `out`; otherwise they must not overlap.
  // Large outputs are written with streaming stores.
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 const OpContext& ctx, const Deadline& dl);

  // buf on `root` is copied into buf on every other rank, as a pipelined chain along the ring.
  void broadcast(void* buf, size_t count, DType t, int root, const OpContext& ctx,
                 const Deadline& dl);

  // Returns once every rank of the group has entered the barrier.
  void barrier(const OpContext& ctx, const Deadline& dl);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // The header every message of the current op carries; `bytes` is filled in per message.
  MsgHeader fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t, uint8_t redop,
                        int root) const;
  // Receive from `peer` and check that the message belongs to the op described by `expect` and
  // carries `bytes` bytes. On a mismatch the group is aborted and the error says how the two ranks
  // disagree.
  const void* recv_checked(int peer, const MsgHeader& expect, size_t bytes, const OpContext& ctx,
                           const Deadline& dl);
  void send_done(int peer, MsgHeader hdr, size_t bytes);

  Transport& t_;
  int rank_;
  int size_;
  size_t slice_bytes_;
};

}  // namespace ringreduce

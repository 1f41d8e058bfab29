// One-shot collectives over the shared window (transport/transport.h, PeerWindow).
//
// Each rank copies its contribution into its own window buffer and publishes it; once every peer
// has published, each rank reads what it needs straight from the peers' buffers. One exchange,
// whatever the world size: for small messages, where the ring's 2(n-1) hand-offs in a row cost
// more than the bytes, this is the fastest way between ranks of one host.
//
// Reductions fold the n contributions of each element in the order the ring does (for the ring's
// chunk c: rank c+1 first, rank c last, reduce/reduce.h's reduce_many), so every rank computes
// the same bits, and they are the bits the ring would give: switching algorithms at a crossover
// never changes a result. Nothing is written to a caller's output before every peer's fingerprint
// has been checked: a desync leaves the outputs as they were.
//
// Bytes moved per rank for an all-reduce of N bytes: N into its buffer, n*N read, N written.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/deadline.h"
#include "common/dtype.h"
#include "algo/messages.h"
#include "transport/transport.h"

namespace ringreduce::oneshot {

// The parts of a call every window algorithm needs.
struct Call {
  PeerWindow& w;
  int rank;
  int size;
  const MsgHeader& fp;  // the op's fingerprint, bytes = the algorithm
  const OpContext& ctx;
  const Deadline& dl;
  // What this rank writes into its buffer for the peers goes around the cache (algo/handoff.h).
  bool stream = false;
};

// out = in[0] op in[1] op ... op in[n-1], divided by `divisor` unless 1. in may equal out.
void allreduce(const Call& c, const void* in, void* out, size_t count, DType t, RedOp op,
               int64_t divisor);
// out = chunk `rank` of the reduction; `in` holds n chunks of `count` elements.
void reduce_scatter(const Call& c, const Chunks& in, void* out, size_t count, DType t, RedOp op,
                    int64_t divisor);
// Chunk r of out = rank r's in (count elements each).
void all_gather(const void* in, const Call& c, const Chunks& out, size_t count, DType t);
// buf on every rank = buf on root.
void broadcast(const Call& c, void* buf, size_t count, DType t, int root);
// out on root = the reduction of every rank's in.
void reduce(const Call& c, const void* in, void* out, size_t count, DType t, RedOp op,
            int64_t divisor, int root);
void barrier(const Call& c);

// For two-shot: the reduction of the ring's chunk `chunk` (`len` elements at byte `offset` of
// every buffer) into dst, in the ring's order. With `own`, this rank's contribution is read from
// there (at the same offset) instead of from its buffer.
void reduce_chunk(const Call& c, void* dst, int chunk, size_t offset, size_t len, DType t,
                  RedOp op, int64_t divisor, const uint8_t* own = nullptr);

}  // namespace ringreduce::oneshot

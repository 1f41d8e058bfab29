// The ring algorithms, written once against the Transport primitives.
//
// All-reduce is the textbook ring: a reduce-scatter (n-1 steps) leaves each rank with one fully
// reduced chunk, and an all-gather (n-1 steps) passes those chunks around until every rank has all
// of them. Each chunk is cut into slices of at most one transport slot, and the whole ring is run
// once per slice index; because a FIFO link holds several slots, a rank may be several slices ahead
// of its successor, so while one slice is being reduced the next ones are already in flight.
//
// Class Ring holds the algorithms that pass messages, one file each: the ring (ring.cpp: all-reduce,
// reduce-scatter, all-gather, reduce, and the barrier's rounds), the chain (chain.cpp: broadcast),
// the star (star.cpp: gather, scatter) and pairwise exchanges (pairwise.cpp: all-to-all). Which of
// them, or of the shared-window algorithms (algo/), serves a call is algo/select.h's business.
//
// The ring never asks which transport carries a message, and the reduction order is fixed by
// rank positions alone, so every rank ends with the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/deadline.h"
#include "common/dtype.h"
#include "reduce/kernels.h"
#include "ring/handoff.h"
#include "transport/transport.h"

namespace ringreduce {

// Where the n chunks of a ring op live: one contiguous buffer (chunk c at base + c * stride), or a
// pointer per chunk (the list forms of reduce_scatter and all_gather).
class Chunks {
 public:
  Chunks(const void* base, size_t stride_bytes)
      : base_(static_cast<uint8_t*>(const_cast<void*>(base))), stride_(stride_bytes) {}
  explicit Chunks(const std::vector<void*>* pointers) : list_(pointers) {}
  uint8_t* at(int c) const {
    return list_ ? static_cast<uint8_t*>((*list_)[static_cast<size_t>(c)])
                 : base_ + static_cast<size_t>(c) * stride_;
  }

 private:
  uint8_t* base_ = nullptr;
  size_t stride_ = 0;
  const std::vector<void*>* list_ = nullptr;
};

class Ring {
 public:
  // slice_bytes: the most a single message carries (clamped to the transport's slot size).
  // `kernels` do the element-wise work on the op's buffers and the transport's slots: the host's
  // by default, a device's for a ring over device memory (reduce/reduce_cuda.h). Both outlive it.
  Ring(Transport& transport, size_t slice_bytes, Kernels& kernels = cpu_kernels());
  // Whether received headers are compared with the op (on by default; see Config).
  void set_check_fingerprints(bool on) { check_fingerprints_ = on; }
  // How ops write the slots their peers read next: plainly or around the cache, chosen by
  // measuring the all-reduces (ring/handoff.h). Plain until configured.
  SlotWrites& slot_writes() { return writes_; }

  // out = in[rank 0] op in[rank 1] op ... (count elements of type t on every rank), then divided
  // by `divisor` when it is not 1 (AVG). `in` may equal `out`; otherwise they must not overlap.
  // Large outputs are written with streaming stores.
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

  // Chunk r of `out` on `root` = rank r's `in` (count elements). `out` is only used on the root.
  void gather(const void* in, const Chunks& out, size_t count, DType t, int root,
              const OpContext& ctx, const Deadline& dl);

  // `out` on rank r = chunk r of `in` on `root` (count elements). `in` is only used on the root.
  void scatter(const Chunks& in, void* out, size_t count, DType t, int root, const OpContext& ctx,
               const Deadline& dl);

  // Rank r sends send_counts[p] elements from `in` chunk p to every rank p, and receives
  // recv_counts[p] elements from rank p into `out` chunk p. The counts must agree pairwise
  // (rank r's send_counts[p] is rank p's recv_counts[r]): a mismatch fails on both.
  void alltoall(const Chunks& in, const std::vector<size_t>& send_counts, const Chunks& out,
                const std::vector<size_t>& recv_counts, DType t, const OpContext& ctx,
                const Deadline& dl);

  // buf on `root` is copied into buf on every other rank, as a pipelined chain along the ring.
  void broadcast(void* buf, size_t count, DType t, int root, const OpContext& ctx,
                 const Deadline& dl);

  // Returns once every rank of the group has entered the barrier.
  void barrier(const OpContext& ctx, const Deadline& dl);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // For algorithms that compose rings (algo/hierarchical.h), whose messages all carry the
  // fingerprint `fp` of the op the caller is in, so that a desync names that op:
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
  // The header every message of an op carries; `bytes` is filled in per message.
  MsgHeader fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t, uint8_t redop,
                        int root) const;
  // The fingerprint's `redop`: the op, with the top bit set when the result is divided (AVG).
  static uint8_t redop_code(RedOp op, int64_t divisor) {
    return static_cast<uint8_t>(static_cast<uint8_t>(op) | (divisor != 1 ? 0x80 : 0));
  }

 private:
  // Receive from `peer` and check that the message belongs to the op described by `expect` and
  // carries `bytes` bytes. On a mismatch the group is aborted and the error says how the two ranks
  // disagree.
  const void* recv_checked(int peer, const MsgHeader& expect, size_t bytes, const OpContext& ctx,
                           const Deadline& dl);
  void send_done(int peer, MsgHeader hdr, size_t bytes);
  void check_root(int root, const OpContext& ctx) const;
  // n-1 steps of "send an empty message to the successor, receive one from the predecessor":
  // a rank that finishes it has checked, through the chain, every other rank's fingerprint (a
  // rank forwards nothing after a mismatch, it aborts the group), so when any two ranks disagree
  // no rank finishes. A barrier; and the opening of ops that would otherwise write outputs before
  // hearing from every rank (those in which data does not pass through every rank on its way, or
  // some ranks only send): a desync then fails every rank before any output byte is written.
  void round(const MsgHeader& fp, const OpContext& ctx, const Deadline& dl);

  // How an op's elements are cut: n chunks of `chunk` elements (the last ones shorter or empty when
  // `count` does not divide by n), each cut into `nslices` slices of at most `slice` elements.
  struct Plan {
    size_t count, chunk, slice, nslices, es;
    bool streaming;  // outputs go around the cache
    bool stream_sends;  // slots a peer reads next are written around the cache (slot_writes())
  };
  struct Span {
    size_t offset;  // elements from the start of the chunk
    size_t len;
  };
  // `timed`: the op reports its time to slot_writes() (the all-reduce).
  Plan plan(size_t count, size_t chunk, DType t, bool timed = false);
  static Span span(const Plan& p, int c, size_t j);

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

  Transport& t_;
  Kernels& k_;
  int rank_;
  int size_;
  size_t slice_bytes_;
  bool check_fingerprints_ = true;
  SlotWrites writes_;
};

}  // namespace ringreduce

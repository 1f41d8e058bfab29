// What every algorithm that passes messages is written against: the Transport's primitives with
// the op's checks around them.
//
// Messages holds, for one group (or one view of it), the transport, the kernels that do the
// element-wise work, the slice size and how slots a peer reads next are written; and it gives
// the algorithms their message primitives: the fingerprint every message of an op carries, a
// receive that checks it (a desync aborts the group and names both ops), the round that makes
// every rank hear from every other before an op writes an output, and the plan that cuts an op's
// elements into chunks and slices. The algorithms themselves are peers in this directory, one
// file each: the ring (ring.h: all-reduce, reduce-scatter, all-gather, reduce, barrier), the chain
// (chain.h: broadcast), the star (star.h: gather, scatter) and pairwise exchanges (pairwise.h:
// all-to-all); the window algorithms (oneshot.h, twoshot.h) use the shared window instead. Which
// one serves a call is select.h's business.
//
// Nothing here asks which transport carries a message, and reduction orders are fixed by rank
// positions alone, so every rank ends with the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/handoff.h"
#include "common/deadline.h"
#include "common/dtype.h"
#include "reduce/kernels.h"
#include "transport/transport.h"

namespace ringreduce {

// Where the n chunks of an op live: one contiguous buffer (chunk c at base + c * stride), or a
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

class Messages {
 public:
  // slice_bytes: the most a single message carries (clamped to the transport's slot size).
  // `kernels` do the element-wise work on the op's buffers and the transport's slots: the host's
  // by default, a device's for messages in device memory (reduce/reduce_cuda.h). Both outlive it.
  Messages(Transport& transport, size_t slice_bytes, Kernels& kernels = cpu_kernels());

  // Whether received headers are compared with the op (on by default; see Config).
  void set_check_fingerprints(bool on) { check_fingerprints_ = on; }
  bool check_fingerprints() const { return check_fingerprints_; }
  // How ops write the slots their peers read next: plainly or around the cache, chosen by
  // measuring the all-reduces (handoff.h). Plain until configured.
  SlotWrites& slot_writes() { return writes_; }

  Transport& transport() const { return t_; }
  Kernels& kernels() const { return k_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slice_bytes() const { return slice_bytes_; }

  // The header every message of an op carries; `bytes` is filled in per message.
  MsgHeader fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t, uint8_t redop,
                        int root) const;
  // The fingerprint's `redop`: the op, with the top bit set when the result is divided (AVG).
  static uint8_t redop_code(RedOp op, int64_t divisor) {
    return static_cast<uint8_t>(static_cast<uint8_t>(op) | (divisor != 1 ? 0x80 : 0));
  }

  // Receive from `peer` and check that the message belongs to the op described by `expect` and
  // carries `bytes` bytes. On a mismatch the group is aborted and the error says how the two ranks
  // disagree.
  const void* recv_checked(int peer, const MsgHeader& expect, size_t bytes, const OpContext& ctx,
                           const Deadline& dl);
  // Publishes the message begun with transport().send_begin(peer), `bytes` long, as `hdr`.
  void send_done(int peer, MsgHeader hdr, size_t bytes);
  // Throws, naming the op, when `root` is not a rank of the group.
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
    bool streaming;     // outputs go around the cache
    bool stream_sends;  // slots a peer reads next are written around the cache (slot_writes())
  };
  struct Span {
    size_t offset;  // elements from the start of the chunk
    size_t len;
  };
  // `timed`: the op reports its time to slot_writes() (the all-reduce).
  Plan plan(size_t count, size_t chunk, DType t, bool timed = false);
  // Slice j of chunk c.
  static Span span(const Plan& p, int c, size_t j);

 private:
  Transport& t_;
  Kernels& k_;
  int rank_;
  int size_;
  size_t slice_bytes_;
  bool check_fingerprints_ = true;
  SlotWrites writes_;
};

// The base of the message algorithms: their group's Messages, and its primitives under the names
// the algorithms' code uses.
class MessageAlgorithm {
 protected:
  explicit MessageAlgorithm(Messages& m)
      : m_(m), t_(m.transport()), k_(m.kernels()), rank_(m.rank()), size_(m.size()) {}

  using Plan = Messages::Plan;
  using Span = Messages::Span;

  MsgHeader fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t, uint8_t redop,
                        int root) const {
    return m_.fingerprint(ctx, kind, count, t, redop, root);
  }
  static uint8_t redop_code(RedOp op, int64_t divisor) { return Messages::redop_code(op, divisor); }
  const void* recv_checked(int peer, const MsgHeader& expect, size_t bytes, const OpContext& ctx,
                           const Deadline& dl) {
    return m_.recv_checked(peer, expect, bytes, ctx, dl);
  }
  void send_done(int peer, const MsgHeader& hdr, size_t bytes) { m_.send_done(peer, hdr, bytes); }
  void check_root(int root, const OpContext& ctx) const { m_.check_root(root, ctx); }
  void round(const MsgHeader& fp, const OpContext& ctx, const Deadline& dl) { m_.round(fp, ctx, dl); }
  Plan plan(size_t count, size_t chunk, DType t, bool timed = false) { return m_.plan(count, chunk, t, timed); }
  static Span span(const Plan& p, int c, size_t j) { return Messages::span(p, c, j); }

  Messages& m_;
  Transport& t_;
  Kernels& k_;
  int rank_;
  int size_;
};

}  // namespace ringreduce

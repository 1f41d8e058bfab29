#include "algo/messages.h"

#include <algorithm>
#include <string>

#include "algo/slicing.h"
#include "common/algos.h"
#include "common/error.h"

namespace ringreduce {

using slicing::ceil_div;

Messages::Messages(Transport& transport, size_t slice_bytes, Kernels& kernels)
    : t_(transport), k_(kernels), rank_(transport.rank()), size_(transport.size()),
      slice_bytes_(std::min(slice_bytes, transport.max_payload())) {
  RR_CHECK(slice_bytes_ >= 16, "ringreduce messages: slice size must be at least 16 bytes, got ",
           slice_bytes_);
}

MsgHeader Messages::fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t,
                            uint8_t redop, int root) const {
  MsgHeader h;
  h.seq = ctx.seq;
  h.count = count;
  h.kind = static_cast<uint16_t>(kind);
  h.algo = static_cast<uint8_t>(Algo::Ring);
  h.dtype = static_cast<uint8_t>(t);
  h.redop = redop;
  h.root = static_cast<int16_t>(root);
  return h;
}

const void* Messages::recv_checked(int peer, const MsgHeader& expect, size_t bytes,
                               const OpContext& ctx, const Deadline& dl) {
  MsgHeader got;
  const void* payload = t_.recv_begin(peer, &got, ctx, dl);
  // The size is checked whatever check_fingerprints_ says: it bounds what the ring reads.
  const bool agree = !check_fingerprints_ || same_op(got, expect);
  if (!agree || got.bytes != bytes) {
    const int me = t_.group_rank(rank_);
    // A group aborted meanwhile (this rank's peer gave up on an earlier op whose messages are
    // still queued here): that is the cause to report, not the stale message.
    const std::string aborted = t_.control().abort_reason();
    if (!aborted.empty()) {
      throw AbortedError(detail::cat(op_prefix(ctx.name, ctx.seq, me),
                                     "the group was aborted: ", aborted));
    }
    const int them = t_.group_rank(peer);
    const std::string msg = detail::cat(
        op_prefix(ctx.name, ctx.seq, me), "this rank and rank ", them,
        " called different collectives: rank ", them, " sent ", describe_op(got), ", rank ", me,
        " is in ", describe_op(expect),
        agree ? detail::cat(" (message of ", got.bytes, " bytes where ", bytes, " were expected)")
                : std::string());
    t_.control().abort_group(msg);
    throw Error(msg);
  }
  return payload;
}

void Messages::send_done(int peer, MsgHeader hdr, size_t bytes) {
  hdr.bytes = bytes;
  t_.send_end(peer, hdr);
}

Messages::Plan Messages::plan(size_t count, size_t chunk, DType t, bool timed) {
  Plan p;
  p.es = dtype_size(t);
  p.count = count;
  p.chunk = chunk;
  p.slice = std::max<size_t>(1, slice_bytes_ / p.es);
  // Even an empty op exchanges one round of (empty) messages, so that a rank whose count differs
  // from its neighbour's hears about it instead of returning while the neighbour waits.
  p.nslices = std::max<size_t>(1, ceil_div(chunk, p.slice));
  p.streaming = false;  // a reduction's output is read soon: plain stores (slicing.h)
  p.stream_sends = writes_.stream(count * p.es, timed);
  return p;
}

Messages::Span Messages::span(const Plan& p, int c, size_t j) {
  const size_t chunk_begin = std::min(p.count, static_cast<size_t>(c) * p.chunk);
  const size_t chunk_len = std::min(p.count - chunk_begin, p.chunk);
  const size_t lo = std::min(chunk_len, j * p.slice);
  return {lo, std::min(chunk_len - lo, p.slice)};
}

void Messages::check_root(int root, const OpContext& ctx) const {
  RR_CHECK(root >= 0 && root < size_, op_prefix(ctx.name, rank_), "root ", root,
           " is not a rank of this group (size ", size_, ")");
}

void Messages::round(const MsgHeader& fp, const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  if (n == 1) return;
  const int next = (rank_ + 1) % n;
  const int prev = (rank_ + n - 1) % n;
  // After step s a rank has heard, through its predecessor, from the s ranks before it; n-1 steps
  // cover the whole group.
  for (int s = 0; s < n - 1; ++s) {
    t_.send_begin(next, ctx, dl);
    send_done(next, fp, 0);
    recv_checked(prev, fp, 0, ctx, dl);
    t_.recv_end(prev);
  }
}

}  // namespace ringreduce

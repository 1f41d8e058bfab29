#include "ring/ring.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "reduce/kernels.h"

namespace ringreduce {

namespace {

// Outputs are written with plain stores. Streaming stores skip the read-for-ownership of each
// output line, but measured on the development machine (AMD EPYC, 32 MiB L3) they lose: a 2-rank
// all-reduce of 64 MiB took 5.7-6.3 ms streamed and 4.5 ms plain, 16 MiB 1.5 ms and 0.9 ms,
// because the caller usually reads its result soon, and plain stores leave part of it in L3.
constexpr bool kStreamOutputs = false;
// All-to-all and broadcast are different: they only copy, nothing of their output is read again
// inside the op, and an output of this size does not stay in L3 anyway. Measured on the
// development machine, 2 ranks, 64 MiB: all-to-all busbw 4.1-4.6 GB/s plain, 4.9-5.3 with its own
// block copied last, 7.1-7.5 also streamed; broadcast 16-18 GB/s plain, 25-30 streamed.
constexpr size_t kStreamLargeOutputBytes = 16u << 20;

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// Lets the transport land receives from `peer` in place for as long as it lives (one op), and
// stops that however the op ends, before the op's buffers go back to the caller.
class Landing {
 public:
  Landing(Transport& t, int peer, Transport::LandFn land) : t_(t), peer_(peer) {
    t_.land_recvs(peer, std::move(land));
  }
  ~Landing() { t_.stop_landing(peer_); }
  Landing(const Landing&) = delete;
  Landing& operator=(const Landing&) = delete;

 private:
  Transport& t_;
  int peer_;
};

}  // namespace

Ring::Ring(Transport& transport, size_t slice_bytes, Kernels& kernels)
    : t_(transport), k_(kernels), rank_(transport.rank()), size_(transport.size()),
      slice_bytes_(std::min(slice_bytes, transport.max_payload())) {
  RR_CHECK(slice_bytes_ >= 16, "ringreduce ring: slice size must be at least 16 bytes, got ",
           slice_bytes_);
}

MsgHeader Ring::fingerprint(const OpContext& ctx, OpKind kind, size_t count, DType t,
                            uint8_t redop, int root) const {
  MsgHeader h;
  h.seq = ctx.seq;
  h.count = count;
  h.kind = static_cast<uint32_t>(kind);
  h.dtype = static_cast<uint8_t>(t);
  h.redop = redop;
  h.root = static_cast<int16_t>(root);
  return h;
}

const void* Ring::recv_checked(int peer, const MsgHeader& expect, size_t bytes,
                               const OpContext& ctx, const Deadline& dl) {
  MsgHeader got;
  const void* payload = t_.recv_begin(peer, &got, ctx, dl);
  // The size is checked whatever check_fingerprints_ says: it bounds what the ring reads.
  const bool agree = !check_fingerprints_ || same_op(got, expect);
  if (!agree || got.bytes != bytes) {
    // A group aborted meanwhile (this rank's peer gave up on an earlier op whose messages are
    // still queued here): that is the cause to report, not the stale message.
    const std::string aborted = t_.abort_reason();
    if (!aborted.empty()) {
      throw AbortedError(detail::cat("ringreduce ", ctx.name, " #", ctx.seq, ": rank ", rank_,
                                     ": the group was aborted: ", aborted));
    }
    const std::string msg = detail::cat(
        "ringreduce ", ctx.name, " #", ctx.seq, ": rank ", rank_, " and rank ", peer,
        " called different collectives: rank ", peer, " sent ", describe_op(got), ", rank ", rank_,
        " is in ", describe_op(expect),
        agree ? detail::cat(" (message of ", got.bytes, " bytes where ", bytes, " were expected)")
                : std::string());
    t_.abort_group(msg);
    throw Error(msg);
  }
  return payload;
}

void Ring::send_done(int peer, MsgHeader hdr, size_t bytes) {
  hdr.bytes = bytes;
  t_.send_end(peer, hdr);
}

Ring::Plan Ring::plan(size_t count, size_t chunk, DType t) const {
  Plan p;
  p.es = dtype_size(t);
  p.count = count;
  p.chunk = chunk;
  p.slice = std::max<size_t>(1, slice_bytes_ / p.es);
  // Even an empty op exchanges one round of (empty) messages, so that a rank whose count differs
  // from its neighbour's hears about it instead of returning while the neighbour waits.
  p.nslices = std::max<size_t>(1, ceil_div(chunk, p.slice));
  p.streaming = kStreamOutputs;
  return p;
}

Ring::Span Ring::span(const Plan& p, int c, size_t j) {
  const size_t chunk_begin = std::min(p.count, static_cast<size_t>(c) * p.chunk);
  const size_t chunk_len = std::min(p.count - chunk_begin, p.chunk);
  const size_t lo = std::min(chunk_len, j * p.slice);
  return {lo, std::min(chunk_len - lo, p.slice)};
}

template <class Finish>
void Ring::reduce_scatter_slice(const Plan& p, size_t j, const Chunks& in, DType t, RedOp op,
                                const MsgHeader& fp, const OpContext& ctx, const Deadline& dl,
                                Finish&& finish) {
  const int n = size_, r = rank_;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // At step s rank r sends the partial sum of chunk r-1-s, to which it has just added its own
  // input, so the partial sum of chunk c visits ranks c+1, c+2, ... and ends at rank c.
  {
    const int c = mod(r - 1);
    const Span sp = span(p, c, j);
    void* dst = t_.send_begin(next, ctx, dl);
    if (sp.len) k_.copy(dst, in.at(c) + sp.offset * p.es, sp.len * p.es, false);
    send_done(next, fp, sp.len * p.es);
  }
  for (int s = 1; s < n - 1; ++s) {
    const int c = mod(r - 1 - s);
    const Span sp = span(p, c, j);
    const void* src = recv_checked(prev, fp, sp.len * p.es, ctx, dl);
    void* dst = t_.send_begin(next, ctx, dl);
    if (sp.len) k_.reduce(dst, src, in.at(c) + sp.offset * p.es, sp.len, t, op);
    send_done(next, fp, sp.len * p.es);
    t_.recv_end(prev);
  }
  const Span sp = span(p, r, j);
  const void* src = recv_checked(prev, fp, sp.len * p.es, ctx, dl);
  finish(sp, src, in.at(r) + sp.offset * p.es);
  t_.recv_end(prev);
}

void* Ring::landing_spot(const Plan& p, size_t j, int s, const Chunks& out, const MsgHeader& fp,
                         const MsgHeader& got) const {
  const int c = ((rank_ - s) % size_ + size_) % size_;
  const Span sp = span(p, c, j);
  if (sp.len == 0 || got.bytes != sp.len * p.es || !same_op(got, fp)) return nullptr;
  return out.at(c) + sp.offset * p.es;
}

void Ring::all_gather_slice(const Plan& p, size_t j, const Chunks& out, const MsgHeader& fp,
                            const OpContext& ctx, const Deadline& dl) {
  const int n = size_, r = rank_;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // At step s rank r receives chunk r-s, sent first by its owner, and forwards it unless its
  // successor is that owner.
  for (int s = 1; s < n; ++s) {
    const int c = ((r - s) % n + n) % n;
    const Span sp = span(p, c, j);
    const void* src = recv_checked(prev, fp, sp.len * p.es, ctx, dl);
    if (s < n - 1) {  // forward first: the successor can start while we write our copy
      void* dst = t_.send_begin(next, ctx, dl);
      if (sp.len) k_.copy(dst, src, sp.len * p.es, false);
      send_done(next, fp, sp.len * p.es);
    }
    uint8_t* target = out.at(c) + sp.offset * p.es;
    if (sp.len && src != target) k_.copy(target, src, sp.len * p.es, p.streaming);  // else it landed there
    t_.recv_end(prev);
  }
}

void Ring::allreduce(const void* in_ptr, void* out_ptr, size_t count, DType t, RedOp op,
                     int64_t divisor, const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  const size_t es = dtype_size(t);
  if (n == 1) {
    if (in_ptr != out_ptr && count > 0) k_.copy(out_ptr, in_ptr, count * es, false);
    if (divisor != 1 && count > 0) k_.divide(out_ptr, out_ptr, count, t, divisor);
    return;
  }
  const Plan p = plan(count, ceil_div(count, static_cast<size_t>(n)), t);
  const Chunks in(in_ptr, p.chunk * es), out(out_ptr, p.chunk * es);
  const MsgHeader fp = fingerprint(ctx, OpKind::Allreduce, count, t,
                                   static_cast<uint8_t>(op) | (divisor != 1 ? 0x80 : 0), -1);
  const int next = (rank_ + 1) % n;
  // From the predecessor come, per slice, n-1 reduce-scatter messages (reduced out of their slot)
  // and then n-1 all-gather ones, which may land straight in `out`.
  const uint64_t per_slice = 2 * static_cast<uint64_t>(n - 1);
  Landing landing(t_, (rank_ + n - 1) % n, [&](uint64_t i, const MsgHeader& got) -> void* {
    const size_t j = i / per_slice;
    const int k = static_cast<int>(i % per_slice) - (n - 1);
    if (j >= p.nslices || k < 0) return nullptr;
    return landing_spot(p, j, k + 1, out, fp, got);
  });
  for (size_t j = 0; j < p.nslices; ++j) {
    // The last reduce-scatter step is fused with the first all-gather step: the result is
    // computed into the outgoing slot (in cache) and our output in one pass (divided there for
    // AVG), and sent on.
    reduce_scatter_slice(p, j, in, t, op, fp, ctx, dl,
                         [&](const Span& sp, const void* partial, const uint8_t* mine) {
                           void* dst = t_.send_begin(next, ctx, dl);
                           if (sp.len) {
                             k_.reduce_and_copy(dst, out.at(rank_) + sp.offset * es, partial, mine,
                                                sp.len, t, op, divisor);
                           }
                           send_done(next, fp, sp.len * es);
                         });
    all_gather_slice(p, j, out, fp, ctx, dl);
  }
}

void Ring::reduce_scatter(const Chunks& in, void* out_ptr, size_t count, DType t, RedOp op,
                          int64_t divisor, const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  const size_t es = dtype_size(t);
  auto* out = static_cast<uint8_t*>(out_ptr);
  if (n == 1) {
    if (count > 0) k_.copy(out, in.at(0), count * es, false);
    if (divisor != 1 && count > 0) k_.divide(out, out, count, t, divisor);
    return;
  }
  const Plan p = plan(count * static_cast<size_t>(n), count, t);
  const MsgHeader fp = fingerprint(ctx, OpKind::ReduceScatter, count, t,
                                   static_cast<uint8_t>(op) | (divisor != 1 ? 0x80 : 0), -1);
  for (size_t j = 0; j < p.nslices; ++j) {
    reduce_scatter_slice(p, j, in, t, op, fp, ctx, dl,
                         [&](const Span& sp, const void* partial, const uint8_t* mine) {
                           if (!sp.len) return;
                           uint8_t* dst = out + sp.offset * es;
                           k_.reduce(dst, partial, mine, sp.len, t, op);
                           if (divisor != 1) k_.divide(dst, dst, sp.len, t, divisor);
                         });
  }
}

void Ring::all_gather(const void* in_ptr, const Chunks& out, size_t count, DType t,
                      const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  const size_t es = dtype_size(t);
  const auto* in = static_cast<const uint8_t*>(in_ptr);
  uint8_t* mine = out.at(rank_);
  if (mine != in && count > 0) k_.copy(mine, in, count * es, false);
  if (n == 1) return;
  const Plan p = plan(count * static_cast<size_t>(n), count, t);
  const MsgHeader fp = fingerprint(ctx, OpKind::AllGather, count, t, 0, -1);
  const int next = (rank_ + 1) % n;
  // From the predecessor come n-1 messages per slice, each landing straight in `out` if it can.
  const uint64_t per_slice = static_cast<uint64_t>(n - 1);
  Landing landing(t_, (rank_ + n - 1) % n, [&](uint64_t i, const MsgHeader& got) -> void* {
    const size_t j = i / per_slice;
    if (j >= p.nslices) return nullptr;
    return landing_spot(p, j, static_cast<int>(i % per_slice) + 1, out, fp, got);
  });
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, rank_, j);
    void* dst = t_.send_begin(next, ctx, dl);
    if (sp.len) k_.copy(dst, mine + sp.offset * es, sp.len * es, false);
    send_done(next, fp, sp.len * es);
    all_gather_slice(p, j, out, fp, ctx, dl);
  }
}

void Ring::reduce(const void* in_ptr, void* out_ptr, size_t count, DType t, RedOp op,
                  int64_t divisor, int root, const OpContext& ctx, const Deadline& dl) {
  check_root(root, ctx);
  const int n = size_;
  const size_t es = dtype_size(t);
  if (n == 1) {
    allreduce(in_ptr, out_ptr, count, t, op, divisor, ctx, dl);
    return;
  }
  const Plan p = plan(count, ceil_div(count, static_cast<size_t>(n)), t);
  const Chunks in(in_ptr, p.chunk * es), out(out_ptr, p.chunk * es);
  const MsgHeader fp = fingerprint(ctx, OpKind::Reduce, count, t,
                                   static_cast<uint8_t>(op) | (divisor != 1 ? 0x80 : 0), root);
  for (size_t j = 0; j < p.nslices; ++j) {
    // Rank r finishes chunk r and sends it straight to the root: n-1 messages into the root
    // instead of an all-gather around the ring.
    reduce_scatter_slice(p, j, in, t, op, fp, ctx, dl,
                         [&](const Span& sp, const void* partial, const uint8_t* mine) {
                           const bool at_root = rank_ == root;
                           void* dst = at_root ? out.at(root) + sp.offset * es
                                               : t_.send_begin(root, ctx, dl);
                           if (sp.len) {
                             k_.reduce(dst, partial, mine, sp.len, t, op);
                             if (divisor != 1) k_.divide(dst, dst, sp.len, t, divisor);
                           }
                           if (!at_root) send_done(root, fp, sp.len * es);
                         });
    if (rank_ != root) continue;
    // Each peer's finished slice j follows all its ring messages of slice j in any FIFO they share
    // (the root's predecessor), so collecting here keeps every FIFO in order.
    for (int c = 0; c < n; ++c) {
      if (c == root) continue;
      const Span sp = span(p, c, j);
      const void* src = recv_checked(c, fp, sp.len * es, ctx, dl);
      if (sp.len) k_.copy(out.at(c) + sp.offset * es, src, sp.len * es, p.streaming);
      t_.recv_end(c);
    }
  }
}

void Ring::gather(const void* in_ptr, const Chunks& out, size_t count, DType t, int root,
                  const OpContext& ctx, const Deadline& dl) {
  check_root(root, ctx);
  const size_t es = dtype_size(t);
  const auto* in = static_cast<const uint8_t*>(in_ptr);
  if (rank_ == root && count > 0 && out.at(root) != in) k_.copy(out.at(root), in, count * es, false);
  if (size_ == 1) return;
  const Plan p = plan(count, count, t);
  const MsgHeader fp = fingerprint(ctx, OpKind::Gather, count, t, 0, root);
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, 0, j);
    if (rank_ != root) {
      void* dst = t_.send_begin(root, ctx, dl);
      if (sp.len) k_.copy(dst, in + sp.offset * es, sp.len * es, false);
      send_done(root, fp, sp.len * es);
      continue;
    }
    // Slice by slice from every peer in turn, so that all of them keep sending.
    for (int c = 0; c < size_; ++c) {
      if (c == root) continue;
      const void* src = recv_checked(c, fp, sp.len * es, ctx, dl);
      if (sp.len) k_.copy(out.at(c) + sp.offset * es, src, sp.len * es, p.streaming);
      t_.recv_end(c);
    }
  }
  round(fp, ctx, dl);  // the non-roots only sent: let them hear if the root found a mismatch
}

void Ring::scatter(const Chunks& in, void* out_ptr, size_t count, DType t, int root,
                   const OpContext& ctx, const Deadline& dl) {
  check_root(root, ctx);
  const size_t es = dtype_size(t);
  auto* out = static_cast<uint8_t*>(out_ptr);
  if (rank_ == root && count > 0 && in.at(root) != out) k_.copy(out, in.at(root), count * es, false);
  if (size_ == 1) return;
  const Plan p = plan(count, count, t);
  const MsgHeader fp = fingerprint(ctx, OpKind::Scatter, count, t, 0, root);
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, 0, j);
    if (rank_ == root) {
      for (int c = 0; c < size_; ++c) {
        if (c == root) continue;
        void* dst = t_.send_begin(c, ctx, dl);
        if (sp.len) k_.copy(dst, in.at(c) + sp.offset * es, sp.len * es, false);
        send_done(c, fp, sp.len * es);
      }
    } else {
      const void* src = recv_checked(root, fp, sp.len * es, ctx, dl);
      if (sp.len) k_.copy(out + sp.offset * es, src, sp.len * es, p.streaming);
      t_.recv_end(root);
    }
  }
  round(fp, ctx, dl);  // the root only sent
}

void Ring::alltoall(const Chunks& in, const std::vector<size_t>& send_counts, const Chunks& out,
                    const std::vector<size_t>& recv_counts, DType t, const OpContext& ctx,
                    const Deadline& dl) {
  const int n = size_, r = rank_;
  RR_CHECK(send_counts.size() == static_cast<size_t>(n) && recv_counts.size() == static_cast<size_t>(n),
           "ringreduce ", ctx.name, ": rank ", r, ": expected ", n, " send and receive counts");
  const size_t es = dtype_size(t);
  RR_CHECK(send_counts[r] == recv_counts[r], "ringreduce ", ctx.name, ": rank ", r, " sends ",
           send_counts[r], " elements to itself but expects to receive ", recv_counts[r]);
  size_t out_bytes = 0;
  for (size_t c : recv_counts) out_bytes += c * es;
  const bool streaming = out_bytes >= kStreamLargeOutputBytes;
  const size_t slice = std::max<size_t>(1, slice_bytes_ / es);
  // Round s pairs every rank with the rank s ahead (to send) and s behind (to receive), so each
  // FIFO has exactly one sender and one receiver at a time. Sends and receives alternate slice by
  // slice: a rank never waits to send while its own inbox is full.
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    // The header's count is the pair's element count, so split sizes that disagree are caught.
    const MsgHeader fp_out = fingerprint(ctx, OpKind::AllToAll, send_counts[to], t, 0, -1);
    const MsgHeader fp_in = fingerprint(ctx, OpKind::AllToAll, recv_counts[from], t, 0, -1);
    const size_t nsend = std::max<size_t>(1, ceil_div(send_counts[to], slice));
    const size_t nrecv = std::max<size_t>(1, ceil_div(recv_counts[from], slice));
    for (size_t j = 0; j < std::max(nsend, nrecv); ++j) {
      if (j < nsend) {
        const size_t off = std::min(send_counts[to], j * slice);
        const size_t len = std::min(send_counts[to] - off, slice);
        void* dst = t_.send_begin(to, ctx, dl);
        if (len) k_.copy(dst, in.at(to) + off * es, len * es, false);
        send_done(to, fp_out, len * es);
      }
      if (j < nrecv) {
        const size_t off = std::min(recv_counts[from], j * slice);
        const size_t len = std::min(recv_counts[from] - off, slice);
        const void* src = recv_checked(from, fp_in, len * es, ctx, dl);
        if (len) k_.copy(out.at(from) + off * es, src, len * es, streaming);
        t_.recv_end(from);
      }
    }
  }
  // Its own block last: while the exchange runs, the peers are kept waiting as little as possible.
  if (send_counts[r] > 0 && in.at(r) != out.at(r)) {
    k_.copy(out.at(r), in.at(r), send_counts[r] * es, streaming);
  }
  // A rank's sends may all fit in its peers' FIFOs before a peer checks them.
  round(fingerprint(ctx, OpKind::AllToAll, 0, t, 0, -1), ctx, dl);
}

void Ring::check_root(int root, const OpContext& ctx) const {
  RR_CHECK(root >= 0 && root < size_, "ringreduce ", ctx.name, ": rank ", rank_, ": root ", root,
           " is not a rank of this group (size ", size_, ")");
}

void Ring::broadcast(void* buf_ptr, size_t count, DType t, int root, const OpContext& ctx,
                     const Deadline& dl) {
  check_root(root, ctx);
  const int n = size_;
  if (n == 1) return;
  auto* buf = static_cast<uint8_t*>(buf_ptr);
  const size_t es = dtype_size(t);
  const int next = (rank_ + 1) % n;
  const int prev = (rank_ + n - 1) % n;
  const int pos = (rank_ - root + n) % n;  // distance from the root along the chain
  const size_t slice = std::max<size_t>(1, slice_bytes_ / es);
  const size_t nslices = std::max<size_t>(1, ceil_div(count, slice));
  const bool streaming = kStreamOutputs || count * es >= kStreamLargeOutputBytes;
  const MsgHeader fp = fingerprint(ctx, OpKind::Broadcast, count, t, 0, root);

  for (size_t j = 0; j < nslices; ++j) {
    const size_t off = std::min(count, j * slice);
    const size_t len = std::min(count - off, slice);
    if (pos == 0) {
      void* dst = t_.send_begin(next, ctx, dl);
      if (len) k_.copy(dst, buf + off * es, len * es, false);
      send_done(next, fp, len * es);
    } else {
      const void* src = recv_checked(prev, fp, len * es, ctx, dl);
      if (pos < n - 1) {  // forward before writing our copy: the successor starts sooner
        void* dst = t_.send_begin(next, ctx, dl);
        if (len) k_.copy(dst, src, len * es, false);
        send_done(next, fp, len * es);
      }
      if (len) k_.copy(buf + off * es, src, len * es, streaming);
      t_.recv_end(prev);
    }
  }
  // The root only sent, and ranks early in the chain may have returned before a later one found
  // a mismatch: the closing round makes them all hear of it.
  round(fp, ctx, dl);
}

void Ring::barrier(const OpContext& ctx, const Deadline& dl) {
  round(fingerprint(ctx, OpKind::Barrier, 0, DType::UInt8, 0, -1), ctx, dl);
}

void Ring::round(const MsgHeader& fp, const OpContext& ctx, const Deadline& dl) {
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

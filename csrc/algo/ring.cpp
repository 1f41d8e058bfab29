#include "algo/ring.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "reduce/kernels.h"
#include "algo/slicing.h"

namespace ringreduce {

using slicing::ceil_div;

namespace {

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
    if (sp.len) k_.copy(dst, in.at(c) + sp.offset * p.es, sp.len * p.es, p.stream_sends);
    send_done(next, fp, sp.len * p.es);
  }
  for (int s = 1; s < n - 1; ++s) {
    const int c = mod(r - 1 - s);
    const Span sp = span(p, c, j);
    const void* src = recv_checked(prev, fp, sp.len * p.es, ctx, dl);
    void* dst = t_.send_begin(next, ctx, dl);
    if (sp.len && p.stream_sends) {
      k_.reduce_streamed(dst, src, in.at(c) + sp.offset * p.es, sp.len, t, op);
    } else if (sp.len) {
      k_.reduce(dst, src, in.at(c) + sp.offset * p.es, sp.len, t, op);
    }
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
      if (sp.len) k_.copy(dst, src, sp.len * p.es, p.stream_sends);
      send_done(next, fp, sp.len * p.es);
    }
    uint8_t* target = out.at(c) + sp.offset * p.es;
    if (sp.len && src != target) k_.copy(target, src, sp.len * p.es, p.streaming);  // else it landed there
    t_.recv_end(prev);
  }
}

void Ring::allreduce(const void* in_ptr, void* out_ptr, size_t count, DType t, RedOp op,
                     int64_t divisor, const OpContext& ctx, const Deadline& dl) {
  allreduce(in_ptr, out_ptr, count, t, op, divisor,
            fingerprint(ctx, OpKind::Allreduce, count, t, redop_code(op, divisor), -1), ctx, dl);
}

void Ring::allreduce(const void* in_ptr, void* out_ptr, size_t count, DType t, RedOp op,
                     int64_t divisor, const MsgHeader& fp, const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  const size_t es = dtype_size(t);
  if (n == 1) {
    if (in_ptr != out_ptr && count > 0) k_.copy(out_ptr, in_ptr, count * es, false);
    if (divisor != 1 && count > 0) k_.divide(out_ptr, out_ptr, count, t, divisor);
    return;
  }
  const Plan p = plan(count, ceil_div(count, static_cast<size_t>(n)), t, /*timed=*/true);
  const auto started = Clock::now();
  const Chunks in(in_ptr, p.chunk * es), out(out_ptr, p.chunk * es);
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
                           uint8_t* result = out.at(rank_) + sp.offset * es;
                           if (sp.len && p.stream_sends) {
                             k_.reduce_and_copy_streamed(dst, result, partial, mine, sp.len, t, op,
                                                         divisor);
                           } else if (sp.len) {
                             k_.reduce_and_copy(dst, result, partial, mine, sp.len, t, op, divisor);
                           }
                           send_done(next, fp, sp.len * es);
                         });
    all_gather_slice(p, j, out, fp, ctx, dl);
  }
  m_.slot_writes().done(count * es, p.stream_sends,
               std::chrono::duration<double>(Clock::now() - started).count());
}

void Ring::reduce_scatter_part(const void* in_ptr, void* out_ptr, size_t count, DType t, RedOp op,
                               int64_t divisor, const MsgHeader& fp, const OpContext& ctx,
                               const Deadline& dl) {
  const size_t es = dtype_size(t);
  if (size_ == 1) {
    if (in_ptr != out_ptr && count > 0) k_.copy(out_ptr, in_ptr, count * es, false);
    if (divisor != 1 && count > 0) k_.divide(out_ptr, out_ptr, count, t, divisor);
    return;
  }
  const Plan p = plan(count, ceil_div(count, static_cast<size_t>(size_)), t);
  const Chunks in(in_ptr, p.chunk * es), out(out_ptr, p.chunk * es);
  for (size_t j = 0; j < p.nslices; ++j) {
    // The chunk this rank finishes is read from `in` only here, at the last step, so `out` may
    // be `in`.
    reduce_scatter_slice(p, j, in, t, op, fp, ctx, dl,
                         [&](const Span& sp, const void* partial, const uint8_t* mine) {
                           if (!sp.len) return;
                           uint8_t* dst = out.at(rank_) + sp.offset * es;
                           k_.reduce(dst, partial, mine, sp.len, t, op);
                           if (divisor != 1) k_.divide(dst, dst, sp.len, t, divisor);
                         });
  }
}

void Ring::all_gather_part(void* buf, size_t count, DType t, const MsgHeader& fp,
                           const OpContext& ctx, const Deadline& dl) {
  const int n = size_;
  if (n == 1) return;
  const size_t es = dtype_size(t);
  const Plan p = plan(count, ceil_div(count, static_cast<size_t>(n)), t);
  const Chunks out(buf, p.chunk * es);
  const int next = (rank_ + 1) % n;
  const uint64_t per_slice = static_cast<uint64_t>(n - 1);
  Landing landing(t_, (rank_ + n - 1) % n, [&](uint64_t i, const MsgHeader& got) -> void* {
    const size_t j = i / per_slice;
    if (j >= p.nslices) return nullptr;
    return landing_spot(p, j, static_cast<int>(i % per_slice) + 1, out, fp, got);
  });
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, rank_, j);
    void* dst = t_.send_begin(next, ctx, dl);
    if (sp.len) k_.copy(dst, out.at(rank_) + sp.offset * es, sp.len * es, p.stream_sends);
    send_done(next, fp, sp.len * es);
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
  const MsgHeader fp = fingerprint(ctx, OpKind::ReduceScatter, count, t, redop_code(op, divisor), -1);
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
  if (n == 1) {
    if (mine != in && count > 0) k_.copy(mine, in, count * es, false);
    return;
  }
  const Plan p = plan(count * static_cast<size_t>(n), count, t);
  const MsgHeader fp = fingerprint(ctx, OpKind::AllGather, count, t, 0, -1);
  const int next = (rank_ + 1) % n;
  // A chunk arrives having passed only the ranks between its owner and this one: with more than
  // two ranks, the others are heard from first, so that a desync leaves `out` as it was. With two,
  // the first message comes from the only peer and is checked before anything is written.
  if (n > 2 && m_.check_fingerprints()) round(fp, ctx, dl);
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
    if (sp.len) k_.copy(dst, in + sp.offset * es, sp.len * es, p.stream_sends);
    send_done(next, fp, sp.len * es);
    all_gather_slice(p, j, out, fp, ctx, dl);
  }
  // Its own chunk last, once every message has been checked.
  if (mine != in && count > 0) k_.copy(mine, in, count * es, false);
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
  const MsgHeader fp = fingerprint(ctx, OpKind::Reduce, count, t, redop_code(op, divisor), root);
  for (size_t j = 0; j < p.nslices; ++j) {
    // Rank r finishes chunk r and sends it straight to the root: n-1 messages into the root
    // instead of an all-gather around the ring.
    reduce_scatter_slice(p, j, in, t, op, fp, ctx, dl,
                         [&](const Span& sp, const void* partial, const uint8_t* mine) {
                           const bool at_root = rank_ == root;
                           void* dst = at_root ? out.at(root) + sp.offset * es
                                               : t_.send_begin(root, ctx, dl);
                           if (sp.len && !at_root && p.stream_sends && divisor == 1) {
                             k_.reduce_streamed(dst, partial, mine, sp.len, t, op);
                           } else if (sp.len) {
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

void Ring::barrier(const OpContext& ctx, const Deadline& dl) {
  round(fingerprint(ctx, OpKind::Barrier, 0, DType::UInt8, 0, -1), ctx, dl);
}

}  // namespace ringreduce

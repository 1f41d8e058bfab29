// Gather and scatter as a star around the root: each byte moves once, between the root and its
// owner, with no rank in between.
#include "algo/star.h"

#include <algorithm>

#include "common/error.h"
#include "algo/slicing.h"

namespace ringreduce {

void Star::gather(const void* in_ptr, const Chunks& out, size_t count, DType t, int root,
                  const OpContext& ctx, const Deadline& dl) {
  check_root(root, ctx);
  const size_t es = dtype_size(t);
  const auto* in = static_cast<const uint8_t*>(in_ptr);
  const MsgHeader fp = fingerprint(ctx, OpKind::Gather, count, t, 0, root);
  // The non-roots only send: the round first makes them hear of a desync the root would find,
  // and the root of one between two non-roots, before its output is written.
  round(fp, ctx, dl);
  if (rank_ == root && count > 0 && out.at(root) != in) k_.copy(out.at(root), in, count * es, false);
  if (size_ == 1) return;
  const Plan p = plan(count, count, t);
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, 0, j);
    if (rank_ != root) {
      void* dst = t_.send_begin(root, ctx, dl);
      if (sp.len) k_.copy(dst, in + sp.offset * es, sp.len * es, p.stream_sends);
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
}

void Star::scatter(const Chunks& in, void* out_ptr, size_t count, DType t, int root,
                   const OpContext& ctx, const Deadline& dl) {
  check_root(root, ctx);
  const size_t es = dtype_size(t);
  auto* out = static_cast<uint8_t*>(out_ptr);
  const MsgHeader fp = fingerprint(ctx, OpKind::Scatter, count, t, 0, root);
  round(fp, ctx, dl);  // the root only sends: as in gather, every rank checks every other first
  if (rank_ == root && count > 0 && in.at(root) != out) k_.copy(out, in.at(root), count * es, false);
  if (size_ == 1) return;
  const Plan p = plan(count, count, t);
  for (size_t j = 0; j < p.nslices; ++j) {
    const Span sp = span(p, 0, j);
    if (rank_ == root) {
      for (int c = 0; c < size_; ++c) {
        if (c == root) continue;
        void* dst = t_.send_begin(c, ctx, dl);
        if (sp.len) k_.copy(dst, in.at(c) + sp.offset * es, sp.len * es, p.stream_sends);
        send_done(c, fp, sp.len * es);
      }
    } else {
      const void* src = recv_checked(root, fp, sp.len * es, ctx, dl);
      if (sp.len) k_.copy(out + sp.offset * es, src, sp.len * es, p.streaming);
      t_.recv_end(root);
    }
  }
}

}  // namespace ringreduce

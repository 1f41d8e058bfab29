#include "algo/collectives.h"

#include "algo/oneshot.h"
#include "algo/twoshot.h"
#include "common/error.h"

namespace ringreduce {

namespace {

// The fingerprint of a window op: as the ring's messages carry it, with its own algorithm, so
// that ranks that chose differently (a configuration they do not share) fail as a desync.
MsgHeader window_fp(const OpContext& ctx, OpKind kind, size_t count, DType t, RedOp op,
                    int64_t divisor, int root, Algo a) {
  MsgHeader h;
  h.seq = ctx.seq;
  h.count = count;
  h.kind = static_cast<uint16_t>(kind);
  h.algo = static_cast<uint8_t>(a);
  h.dtype = static_cast<uint8_t>(t);
  h.redop = Messages::redop_code(op, divisor);
  h.root = static_cast<int16_t>(root);
  return h;
}

}  // namespace

Collectives::Collectives(Messages& messages, PeerWindow* window, const Selector& selector,
                         std::unique_ptr<Hierarchical> hierarchical)
    : msgs_(messages), ring_(messages), chain_(messages), star_(messages), pairwise_(messages),
      w_(window), hier_(std::move(hierarchical)), sel_(selector), rank_(messages.rank()),
      size_(messages.size()) {}

Algo Collectives::algorithm(OpKind kind, size_t bytes) const {
  const Algo a = kind == OpKind::Allreduce ? sel_.allreduce(bytes) : sel_.other(kind, bytes);
  // The selector was given no window where there is none (the caller's contract): a window
  // algorithm here would be a bug, not a choice.
  RR_CHECK(a == Algo::Ring || a == Algo::Hierarchical ? true : w_ != nullptr,
           "ringreduce: the selector chose ", algo_name(a), " for a group without a shared window");
  RR_CHECK(a != Algo::Hierarchical || hier_ != nullptr,
           "ringreduce: the selector chose hierarchical for a group without its layout");
  return a;
}

void Collectives::allreduce(const void* in, void* out, size_t count, DType t, RedOp op,
                            int64_t divisor, const OpContext& ctx, const Deadline& dl) {
  const Algo a = algorithm(OpKind::Allreduce, count * dtype_size(t));
  if (a == Algo::Ring) return ring_.allreduce(in, out, count, t, op, divisor, ctx, dl);
  if (a == Algo::Hierarchical) {
    // The ring's fingerprint, with its own algorithm: ranks that chose differently fail as a
    // desync.
    MsgHeader fp = msgs_.fingerprint(ctx, OpKind::Allreduce, count, t, Messages::redop_code(op, divisor), -1);
    fp.algo = static_cast<uint8_t>(Algo::Hierarchical);
    return hier_->allreduce(in, out, count, t, op, divisor, fp, ctx, dl);
  }
  const MsgHeader fp = window_fp(ctx, OpKind::Allreduce, count, t, op, divisor, -1, a);
  const size_t bytes = count * dtype_size(t);
  const bool stream = window_writes_.stream(bytes, /*timed=*/true);
  const bool timed = window_writes_.learns(bytes);
  const auto started = timed ? Clock::now() : Clock::time_point{};
  const oneshot::Call c{*w_, rank_, size_, fp, ctx, dl, stream};
  if (a == Algo::TwoShot) {
    twoshot::allreduce(c, in, out, count, t, op, divisor);
  } else {
    oneshot::allreduce(c, in, out, count, t, op, divisor);
  }
  if (timed) window_writes_.done(bytes, stream, std::chrono::duration<double>(Clock::now() - started).count());
}

void Collectives::reduce_scatter(const Chunks& in, void* out, size_t count, DType t, RedOp op,
                                 int64_t divisor, const OpContext& ctx, const Deadline& dl) {
  const size_t whole = count * dtype_size(t) * static_cast<size_t>(size_);
  const Algo a = algorithm(OpKind::ReduceScatter, whole);
  if (a == Algo::Ring) return ring_.reduce_scatter(in, out, count, t, op, divisor, ctx, dl);
  const MsgHeader fp = window_fp(ctx, OpKind::ReduceScatter, count, t, op, divisor, -1, a);
  oneshot::reduce_scatter({*w_, rank_, size_, fp, ctx, dl}, in, out, count, t, op, divisor);
}

void Collectives::all_gather(const void* in, const Chunks& out, size_t count, DType t,
                             const OpContext& ctx, const Deadline& dl) {
  const Algo a = algorithm(OpKind::AllGather, count * dtype_size(t));
  if (a == Algo::Ring) return ring_.all_gather(in, out, count, t, ctx, dl);
  const MsgHeader fp = window_fp(ctx, OpKind::AllGather, count, t, RedOp::Sum, 1, -1, a);
  oneshot::all_gather(in, {*w_, rank_, size_, fp, ctx, dl}, out, count, t);
}

void Collectives::reduce(const void* in, void* out, size_t count, DType t, RedOp op,
                         int64_t divisor, int root, const OpContext& ctx, const Deadline& dl) {
  const Algo a = root >= 0 && root < size_ ? algorithm(OpKind::Reduce, count * dtype_size(t))
                                           : Algo::Ring;  // the ring names a bad root
  if (a == Algo::Ring) return ring_.reduce(in, out, count, t, op, divisor, root, ctx, dl);
  const MsgHeader fp = window_fp(ctx, OpKind::Reduce, count, t, op, divisor, root, a);
  oneshot::reduce({*w_, rank_, size_, fp, ctx, dl}, in, out, count, t, op, divisor, root);
}

void Collectives::broadcast(void* buf, size_t count, DType t, int root, const OpContext& ctx,
                            const Deadline& dl) {
  const Algo a = root >= 0 && root < size_ ? algorithm(OpKind::Broadcast, count * dtype_size(t))
                                           : Algo::Ring;
  if (a == Algo::Ring) return chain_.broadcast(buf, count, t, root, ctx, dl);
  const MsgHeader fp = window_fp(ctx, OpKind::Broadcast, count, t, RedOp::Sum, 1, root, a);
  oneshot::broadcast({*w_, rank_, size_, fp, ctx, dl}, buf, count, t, root);
}

void Collectives::barrier(const OpContext& ctx, const Deadline& dl) {
  const Algo a = algorithm(OpKind::Barrier, 0);
  if (a == Algo::Ring) return ring_.barrier(ctx, dl);
  const MsgHeader fp = window_fp(ctx, OpKind::Barrier, 0, DType::UInt8, RedOp::Sum, 1, -1, a);
  oneshot::barrier({*w_, rank_, size_, fp, ctx, dl});
}

}  // namespace ringreduce

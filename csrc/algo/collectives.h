// The algorithm layer's front: what the backend calls for every collective.
//
// Each call asks the Selector (algo/select.h) which algorithm serves it and runs that one: over
// messages the ring (ring.h), the chain (chain.h), the star (star.h) or pairwise exchanges
// (pairwise.h); over the shared window the one-shot and two-shot forms (oneshot.h, twoshot.h); or
// across hosts the hierarchical all-reduce (hierarchical.h). The methods have the contracts of
// those algorithms'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "algo/hierarchical.h"
#include "algo/select.h"
#include "algo/chain.h"
#include "algo/messages.h"
#include "algo/pairwise.h"
#include "algo/ring.h"
#include "algo/star.h"

namespace ringreduce {

class Collectives {
 public:
  // `messages` and `window` (null: messages only) outlive this. `hierarchical`: the all-reduce of
  // a group across hosts, where its layout allows one (Selector::hierarchical), else null.
  Collectives(Messages& messages, PeerWindow* window, const Selector& selector,
              std::unique_ptr<Hierarchical> hierarchical = nullptr);

  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 const OpContext& ctx, const Deadline& dl);
  void reduce_scatter(const Chunks& in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                      const OpContext& ctx, const Deadline& dl);
  void all_gather(const void* in, const Chunks& out, size_t count, DType t, const OpContext& ctx,
                  const Deadline& dl);
  void reduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor, int root,
              const OpContext& ctx, const Deadline& dl);
  void broadcast(void* buf, size_t count, DType t, int root, const OpContext& ctx,
                 const Deadline& dl);
  void barrier(const OpContext& ctx, const Deadline& dl);
  // These move each byte once, between two ranks: messages serve them at every size.
  void gather(const void* in, const Chunks& out, size_t count, DType t, int root,
              const OpContext& ctx, const Deadline& dl) {
    star_.gather(in, out, count, t, root, ctx, dl);
  }
  void scatter(const Chunks& in, void* out, size_t count, DType t, int root, const OpContext& ctx,
               const Deadline& dl) {
    star_.scatter(in, out, count, t, root, ctx, dl);
  }
  void alltoall(const Chunks& in, const std::vector<size_t>& send_counts, const Chunks& out,
                const std::vector<size_t>& recv_counts, DType t, const OpContext& ctx,
                const Deadline& dl) {
    pairwise_.alltoall(in, send_counts, out, recv_counts, t, ctx, dl);
  }

  // The algorithm a call of `kind` with `bytes` per rank (the whole input for reduce_scatter)
  // would take in this group.
  Algo algorithm(OpKind kind, size_t bytes) const;
  const Selector& selector() const { return sel_; }
  // How the window all-reduces write what the peers read (handoff.h); the messages have their own.
  SlotWrites& window_writes() { return window_writes_; }
  void set_selector(const Selector& s) { sel_ = s; }

 private:
  Messages& msgs_;
  Ring ring_;
  Chain chain_;
  Star star_;
  Pairwise pairwise_;
  PeerWindow* w_;
  std::unique_ptr<Hierarchical> hier_;
  Selector sel_;
  SlotWrites window_writes_;
  int rank_;
  int size_;
};

}  // namespace ringreduce

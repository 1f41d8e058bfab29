// Which algorithm serves which call: the one place that says so.
//
// Every collective is chosen per call from the message size, the world size and what the
// transport offers (a shared window or only messages), so the choice is the same on every rank:
// it depends on sizes and on the group's agreed configuration, never on timings.
//
// The crossovers below were measured with the benchmarks (docs/algorithms.md has the tables and
// how they were taken). RINGREDUCE_ALGO, or RingBackend::set_algorithm for one group, forces one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/algos.h"
#include "transport/transport.h"

namespace ringreduce {

class Selector {
 public:
  // `window_bytes`: the shared window's buffer size, 0 when the group has none (TCP, CUDA, a
  // group that spans hosts). `forced`: Auto, or the algorithm every call that can use it takes.
  // `hosts` x `per_host`: the group's layout when it spans hosts with as many ranks on each
  // (per_host 0 otherwise), for the hierarchical all-reduce.
  Selector(int world, size_t window_bytes, Algo forced, int hosts = 1, int per_host = 0);
  // The same group with another algorithm forced (RingBackend::set_algorithm).
  Selector forcing(Algo forced) const;

  // The algorithm for an all-reduce of `bytes` per rank.
  Algo allreduce(size_t bytes) const;
  // For the other collectives with a window form (reduce_scatter, allgather, broadcast, reduce,
  // barrier): OneShot (one exchange through the window) or Ring. `bytes` is what one rank puts in
  // its buffer: its whole input (n chunks for reduce_scatter), or the root's for broadcast.
  Algo other(OpKind kind, size_t bytes) const;

  Algo forced() const { return forced_; }
  // Whether the group's layout allows the hierarchical all-reduce: at least two hosts, with as
  // many ranks (at least two) on each.
  bool hierarchical() const { return hosts_ > 1 && per_host_ > 1; }
  // The all-reduce crossovers in force, for the INFO line and the docs: "oneshot<=32768
  // twoshot<=1048576 ring above" (two-shot left out where it serves no size) or "ring (no shared
  // window)".
  std::string describe() const;

 private:
  int world_;
  size_t window_;
  Algo forced_;
  int hosts_;
  int per_host_;
  size_t oneshot_max_;  // largest all-reduce (bytes per rank) taken one-shot
  size_t twoshot_max_;  // largest taken two-shot
  size_t other_max_;    // largest other collective taken through the window
};

}  // namespace ringreduce

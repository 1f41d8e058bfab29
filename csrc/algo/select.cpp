#include "algo/select.h"

#include <algorithm>

#include "common/error.h"

namespace ringreduce {

namespace {

// All-reduce crossovers by world size, in bytes per rank (docs/algorithms.md, "Crossovers").
// One-shot moves n times the message through every rank's reduction but needs one exchange;
// two-shot moves about twice the message and needs two; the ring moves 2(n-1)/n of it but needs
// 2(n-1) hand-offs in a row per slice. So one-shot wins where a hand-off costs more than reading
// the n inputs, two-shot above that until its buffers fall out of cache, the ring beyond.
struct Crossover {
  int world;            // this row serves groups of up to this many ranks
  size_t oneshot_max;   // one-shot up to here
  size_t twoshot_max;   // then two-shot up to here (capped by the window), the ring above
  size_t other_max;     // the other collectives' window form up to here
};

constexpr Crossover kTable[] = {
    {2, 8u << 10, 1u << 20, 256u << 10},
    {3, 128u << 10, 128u << 10, 256u << 10},  // two-shot never led at 3 ranks
    {4, 32u << 10, 128u << 10, 256u << 10},
    {8, 32u << 10, 256u << 10, 128u << 10},
    {1 << 30, 8u << 10, 512u << 10, 64u << 10},
};

const Crossover& row_for(int world) {
  for (const Crossover& c : kTable) {
    if (world <= c.world) return c;
  }
  return kTable[sizeof kTable / sizeof kTable[0] - 1];
}

}  // namespace

Selector::Selector(int world, size_t window_bytes, Algo forced, int hosts, int per_host)
    : world_(world), window_(world > 1 && hosts <= 1 ? window_bytes : 0), forced_(forced),
      hosts_(hosts), per_host_(per_host) {
  const Crossover& c = row_for(world);
  oneshot_max_ = std::min(c.oneshot_max, window_);
  twoshot_max_ = std::min(c.twoshot_max, window_);
  other_max_ = std::min(c.other_max, window_);
}

Selector Selector::forcing(Algo forced) const {
  Selector s = *this;
  s.forced_ = forced;
  return s;
}

Algo Selector::allreduce(size_t bytes) const {
  // Across hosts the hierarchical form serves every size: it crosses the network in 2(h-1)
  // hand-offs of 1/per_host of the message each, where the flat ring takes 2(n-1) hand-offs,
  // each as slow as its slowest (network) hop, and carries 2(n-1)/n of the message over each
  // host's link (docs/hosts.md has the model and the measurements).
  if (hierarchical()) return forced_ == Algo::Auto || forced_ == Algo::Hierarchical ? Algo::Hierarchical : Algo::Ring;
  if (window_ == 0 || bytes > window_) return Algo::Ring;
  switch (forced_) {
    case Algo::Auto: break;
    case Algo::Hierarchical: return Algo::Ring;  // one host: nothing to be hierarchical about
    default: return forced_;
  }
  if (bytes <= oneshot_max_) return Algo::OneShot;
  if (bytes <= twoshot_max_) return Algo::TwoShot;
  return Algo::Ring;
}

Algo Selector::other(OpKind kind, size_t bytes) const {
  if (window_ == 0 || bytes > window_) return Algo::Ring;
  if (forced_ == Algo::Ring || forced_ == Algo::Hierarchical) return Algo::Ring;
  if (forced_ != Algo::Auto) return Algo::OneShot;
  // A barrier carries nothing: one exchange through the window is all it is.
  if (kind == OpKind::Barrier) return Algo::OneShot;
  return bytes <= other_max_ ? Algo::OneShot : Algo::Ring;
}

std::string Selector::describe() const {
  if (hierarchical()) {
    const bool ring = forced_ != Algo::Auto && forced_ != Algo::Hierarchical;
    return detail::cat(ring ? "ring forced" : "hierarchical all-reduce", " (", hosts_, " hosts x ",
                       per_host_, " ranks); ring for the other collectives");
  }
  if (window_ == 0) return world_ > 1 ? "ring (no shared window)" : "local copy (one rank)";
  if (forced_ != Algo::Auto) {
    return detail::cat(algo_name(forced_), " forced (up to ", window_, " bytes, the ring above)");
  }
  return detail::cat("oneshot<=", oneshot_max_,
                     twoshot_max_ > oneshot_max_ ? detail::cat(" twoshot<=", twoshot_max_) : "",
                     " ring above; other collectives through the window <=", other_max_);
}

}  // namespace ringreduce

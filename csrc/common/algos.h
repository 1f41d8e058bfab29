// The algorithms' names and numbers: the one list, below every layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ringreduce {

// The one list of algorithms, a row each: X(tag, name, serves, what). The enum, algo_name(),
// parse_algo() and its error, and ringreduce._C.algorithms() (`python -m ringreduce.info
// --algorithms`) are made from it; tests check that RINGREDUCE_ALGO's knob text and
// docs/algorithms.md name the same ones. Every message header carries the number of the algorithm
// that sent it (MsgHeader::algo: a rank that chose another algorithm fails as a desync, and the
// error names both), so a row keeps its place. Here, below every layer, so that the transport
// layer's describe_op can name them; algo/select.h chooses among them.
#define RINGREDUCE_ALGORITHMS(X)                                                                   \
  X(Auto, "auto", "every collective",                                                              \
    "by size, world and layout (the crossover table in algo/select.cpp)")                          \
  X(Ring, "ring", "every collective",                                                              \
    "messages around the ring, and its chain, star and pairwise forms (algo/ring.h etc.)")         \
  X(OneShot, "oneshot", "allreduce, reduce_scatter, allgather, broadcast, reduce, barrier",        \
    "every rank reads every input from the shared window (algo/oneshot.h)")                        \
  X(TwoShot, "twoshot", "allreduce",                                                               \
    "reduce-scatter, then all-gather, by direct reads of the window (algo/twoshot.h)")             \
  X(Hierarchical, "hierarchical", "allreduce",                                                     \
    "rings inside each host and between hosts (algo/hierarchical.h)")

enum class Algo : uint8_t {
#define RINGREDUCE_ALGO_TAG(tag, name, serves, what) tag,
  RINGREDUCE_ALGORITHMS(RINGREDUCE_ALGO_TAG)
#undef RINGREDUCE_ALGO_TAG
};

struct AlgoInfo {
  Algo algo;
  const char* name;
  const char* serves;  // the collectives it carries where it applies
  const char* what;
};
// Every row of RINGREDUCE_ALGORITHMS, in order.
const std::vector<AlgoInfo>& algorithm_list();

const char* algo_name(Algo a);
// The algorithm named `text`; throws ringreduce::Error naming `what` and listing the names otherwise.
Algo parse_algo(const std::string& text, const char* what);

}  // namespace ringreduce

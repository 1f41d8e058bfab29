// What the message algorithms of ring/ share about cutting and writing their outputs.
#pragma once

#include <cstddef>

namespace ringreduce::slicing {

// Reductions write their outputs with plain stores: the caller usually reads its result soon, and
// plain stores leave part of it in the L3 cache, where streaming stores (which skip each line's
// read for ownership) would not. All-to-all and broadcast only copy, nothing of their output is
// read again inside the op, and an output this large does not stay in L3 anyway: they stream
// outputs of at least this many bytes. docs/design.md#algorithms has the measurements.
inline constexpr size_t kStreamLargeOutputBytes = 16u << 20;

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace ringreduce::slicing

// What the message algorithms of ring/ share about cutting and writing their outputs.
#pragma once

#include <cstddef>

namespace ringreduce::slicing {

// Outputs are written with plain stores. Streaming stores skip the read-for-ownership of each
// output line, but measured on the development machine (AMD EPYC, 32 MiB L3) they lose: a 2-rank
// all-reduce of 64 MiB took 5.7-6.3 ms streamed and 4.5 ms plain, 16 MiB 1.5 ms and 0.9 ms,
// because the caller usually reads its result soon, and plain stores leave part of it in L3.
inline constexpr bool kStreamOutputs = false;
// All-to-all and broadcast are different: they only copy, nothing of their output is read again
// inside the op, and an output of this size does not stay in L3 anyway. Measured on the
// development machine, 2 ranks, 64 MiB: all-to-all busbw 4.1-4.6 GB/s plain, 4.9-5.3 with its own
// block copied last, 7.1-7.5 also streamed; broadcast 16-18 GB/s plain, 25-30 streamed.
inline constexpr size_t kStreamLargeOutputBytes = 16u << 20;

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace ringreduce::slicing

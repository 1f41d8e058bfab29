// Two-shot all-reduce over the shared window (transport/transport.h, PeerWindow).
//
// A reduce-scatter and an all-gather, both by direct reads: every rank copies its input into its
// window buffer and publishes it; rank r reduces chunk r from every rank's buffer (in the ring's
// order, so the bits are the ring's) into its own buffer's chunk r and publishes
// that; then every rank copies the n reduced chunks into its output. Two exchanges instead of the
// ring's 2(n-1) hand-offs, and each rank reduces only 1/n of the message instead of all of it as
// in one-shot: the middle sizes.
//
// Bytes moved per rank for N bytes: N into its buffer, N read and N/n written to reduce its
// chunk, N read and N written to gather.
#pragma once

#include "algo/oneshot.h"

namespace ringreduce::twoshot {

void allreduce(const oneshot::Call& c, const void* in, void* out, size_t count, DType t, RedOp op,
               int64_t divisor);

}  // namespace ringreduce::twoshot

// All-to-all as n-1 rounds of pairwise exchanges: in round s every rank sends to the rank s ahead
// and receives from the rank s behind.
#include "algo/pairwise.h"

#include <algorithm>

#include "common/error.h"
#include "algo/slicing.h"

namespace ringreduce {

using slicing::ceil_div;
using slicing::kStreamLargeOutputBytes;

void Pairwise::alltoall(const Chunks& in, const std::vector<size_t>& send_counts, const Chunks& out,
                    const std::vector<size_t>& recv_counts, DType t, const OpContext& ctx,
                    const Deadline& dl) {
  const int n = size_, r = rank_;
  RR_CHECK(send_counts.size() == static_cast<size_t>(n) && recv_counts.size() == static_cast<size_t>(n),
           op_prefix(ctx.name, r), "expected ", n, " send and receive counts");
  const size_t es = dtype_size(t);
  RR_CHECK(send_counts[r] == recv_counts[r], "ringreduce ", ctx.name, ": rank ", r, " sends ",
           send_counts[r], " elements to itself but expects to receive ", recv_counts[r]);
  size_t out_bytes = 0;
  for (size_t c : recv_counts) out_bytes += c * es;
  const bool streaming = out_bytes >= kStreamLargeOutputBytes;
  size_t in_bytes = 0;
  for (size_t c : send_counts) in_bytes += c * es;
  const bool stream_sends = m_.slot_writes().stream(in_bytes, false);
  const size_t slice = std::max<size_t>(1, m_.slice_bytes() / es);
  // First every pair checks its counts with one empty message each way, and the round makes every
  // rank hear that all pairs agreed (a rank that found a mismatch aborts the group and forwards
  // nothing), so that a desync fails every rank before any output byte is written.
  // The header's count is the pair's element count, so split sizes that disagree are caught.
  auto pair_fp = [&](size_t count) { return fingerprint(ctx, OpKind::AllToAll, count, t, 0, -1); };
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    t_.send_begin(to, ctx, dl);
    send_done(to, pair_fp(send_counts[to]), 0);
  }
  for (int s = 1; s < n; ++s) {
    const int from = (r - s + n) % n;
    recv_checked(from, pair_fp(recv_counts[from]), 0, ctx, dl);
    t_.recv_end(from);
  }
  round(fingerprint(ctx, OpKind::AllToAll, 0, t, 0, -1), ctx, dl);
  // Round s pairs every rank with the rank s ahead (to send) and s behind (to receive), so each
  // FIFO has exactly one sender and one receiver at a time. Sends and receives alternate slice by
  // slice: a rank never waits to send while its own inbox is full.
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    const MsgHeader fp_out = pair_fp(send_counts[to]);
    const MsgHeader fp_in = pair_fp(recv_counts[from]);
    const size_t nsend = std::max<size_t>(1, ceil_div(send_counts[to], slice));
    const size_t nrecv = std::max<size_t>(1, ceil_div(recv_counts[from], slice));
    for (size_t j = 0; j < std::max(nsend, nrecv); ++j) {
      if (j < nsend) {
        const size_t off = std::min(send_counts[to], j * slice);
        const size_t len = std::min(send_counts[to] - off, slice);
        void* dst = t_.send_begin(to, ctx, dl);
        if (len) k_.copy(dst, in.at(to) + off * es, len * es, stream_sends);
        send_done(to, fp_out, len * es);
      }
      if (j < nrecv) {
        const size_t off = std::min(recv_counts[from], j * slice);
        const size_t len = std::min(recv_counts[from] - off, slice);
        const void* src = recv_checked(from, fp_in, len * es, ctx, dl);
        if (len) k_.copy(out.at(from) + off * es, src, len * es, streaming);
        t_.recv_end(from);
      }
    }
  }
  // Its own block last: while the exchange runs, the peers are kept waiting as little as possible.
  if (send_counts[r] > 0 && in.at(r) != out.at(r)) {
    k_.copy(out.at(r), in.at(r), send_counts[r] * es, streaming);
  }
}

}  // namespace ringreduce

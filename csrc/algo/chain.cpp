// Broadcast as a pipelined chain along the ring from the root: each slice is forwarded before it
// is copied out, so every link carries the message once.
#include "algo/chain.h"

#include <algorithm>

#include "common/error.h"
#include "algo/slicing.h"

namespace ringreduce {

using slicing::ceil_div;
using slicing::kStreamLargeOutputBytes;

void Chain::broadcast(void* buf_ptr, size_t count, DType t, int root, const OpContext& ctx,
                     const Deadline& dl) {
  check_root(root, ctx);
  const int n = size_;
  if (n == 1) return;
  auto* buf = static_cast<uint8_t*>(buf_ptr);
  const size_t es = dtype_size(t);
  const int next = (rank_ + 1) % n;
  const int prev = (rank_ + n - 1) % n;
  const int pos = (rank_ - root + n) % n;  // distance from the root along the chain
  const size_t slice = std::max<size_t>(1, m_.slice_bytes() / es);
  const size_t nslices = std::max<size_t>(1, ceil_div(count, slice));
  const bool streaming = count * es >= kStreamLargeOutputBytes;
  const bool stream_sends = m_.slot_writes().stream(count * es, false);
  const MsgHeader fp = fingerprint(ctx, OpKind::Broadcast, count, t, 0, root);
  // A rank hears only from its predecessor, and the root from no one: the round first makes every
  // rank check every other, so a desync fails them all before any buffer is written.
  round(fp, ctx, dl);

  for (size_t j = 0; j < nslices; ++j) {
    const size_t off = std::min(count, j * slice);
    const size_t len = std::min(count - off, slice);
    if (pos == 0) {
      void* dst = t_.send_begin(next, ctx, dl);
      if (len) k_.copy(dst, buf + off * es, len * es, stream_sends);
      send_done(next, fp, len * es);
    } else {
      const void* src = recv_checked(prev, fp, len * es, ctx, dl);
      if (pos < n - 1) {  // forward before writing our copy: the successor starts sooner
        void* dst = t_.send_begin(next, ctx, dl);
        if (len) k_.copy(dst, src, len * es, stream_sends);
        send_done(next, fp, len * es);
      }
      if (len) k_.copy(buf + off * es, src, len * es, streaming);
      t_.recv_end(prev);
    }
  }
}

}  // namespace ringreduce

#include "algo/twoshot.h"

#include <algorithm>

#include "reduce/reduce.h"

namespace ringreduce::twoshot {

void allreduce(const oneshot::Call& c, const void* in, void* out_ptr, size_t count, DType t,
               RedOp op, int64_t divisor) {
  const size_t es = dtype_size(t);
  const size_t chunk = (count + c.size - 1) / c.size;
  auto lo = [&](int r) { return std::min(count, static_cast<size_t>(r) * chunk); };
  auto len = [&](int r) { return std::min(count - lo(r), chunk); };

  // The peers read the other chunks of this rank's input from its buffer; its own chunk it reads
  // from the input itself, so that part is not copied (half the copy at world 2).
  const auto* src = static_cast<const uint8_t*>(in);
  const size_t own = lo(c.rank) * es;
  const size_t own_end = own + len(c.rank) * es;
  uint8_t* mine = c.w.begin(c.fp, c.ctx, count * es);
  copy(mine, src, own, c.stream);
  copy(mine + own_end, src + own_end, count * es - own_end, c.stream);
  c.w.publish();
  c.w.wait_all(c.ctx, c.dl);

  // Chunk r, reduced into this rank's own buffer: nobody else reads it before the next phase.
  // Streamed, it is reduced into the output first (where the output is the input, each element
  // is read before it is written) and streamed from there into the buffer.
  auto* out = static_cast<uint8_t*>(out_ptr);
  // At world 2 the chunk is the peer's part and this rank's, in that order: one pass writes it
  // to both places, so the output's own chunk needs no copy back from the buffer.
  const bool both = c.size == 2 && !c.stream;
  if (both) {
    const int peer = 1 - c.rank;
    reduce_and_copy(mine + own, out + own, c.w.buffer(peer) + own, src + own, len(c.rank), t, op,
                    divisor);
  } else if (c.stream) {
    oneshot::reduce_chunk(c, out + own, c.rank, own, len(c.rank), t, op, divisor, src);
    copy(mine + own, out + own, len(c.rank) * es, true);
  } else {
    oneshot::reduce_chunk(c, mine + own, c.rank, own, len(c.rank), t, op, divisor, src);
  }
  c.w.publish();
  c.w.wait_all(c.ctx, c.dl);

  for (int p = 0; p < c.size; ++p) {
    if (p == c.rank && (c.stream || both)) continue;  // in the output already
    copy(out + lo(p) * es, c.w.buffer(p) + lo(p) * es, len(p) * es);
  }
}

}  // namespace ringreduce::twoshot

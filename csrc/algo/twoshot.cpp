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

  uint8_t* mine = c.w.begin(c.fp, c.ctx);
  copy(mine, in, count * es);
  c.w.publish();
  c.w.wait_all(c.ctx, c.dl);

  // Chunk r, reduced into this rank's own buffer: nobody else reads it before the next phase.
  oneshot::reduce_chunk(c, mine + lo(c.rank) * es, c.rank, lo(c.rank) * es, len(c.rank), t, op,
                        divisor);
  c.w.publish();
  c.w.wait_all(c.ctx, c.dl);

  auto* out = static_cast<uint8_t*>(out_ptr);
  for (int p = 0; p < c.size; ++p) copy(out + lo(p) * es, c.w.buffer(p) + lo(p) * es, len(p) * es);
}

}  // namespace ringreduce::twoshot

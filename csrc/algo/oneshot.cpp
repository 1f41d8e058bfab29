#include "algo/oneshot.h"

#include <algorithm>

#include "common/small_array.h"
#include "reduce/reduce.h"

namespace ringreduce::oneshot {

namespace {

// Begins the op with `bytes` of window, lets `fill` write this rank's contribution, publishes it
// and waits for every peer's. Returns this rank's buffer.
template <class Fill>
uint8_t* exchange(const Call& c, size_t bytes, Fill&& fill) {
  uint8_t* mine = c.w.begin(c.fp, c.ctx, bytes);
  fill(mine);
  c.w.publish();
  c.w.wait_all(c.ctx, c.dl);
  return mine;
}

}  // namespace

void reduce_chunk(const Call& c, void* dst, int chunk, size_t offset, size_t len, DType t,
                  RedOp op, int64_t divisor, const uint8_t* own) {
  if (len == 0) return;
  SmallArray<const void*> src(static_cast<size_t>(c.size));
  for (int k = 0; k < c.size; ++k) {
    const int r = (chunk + 1 + k) % c.size;
    src[k] = (r == c.rank && own != nullptr ? own : c.w.buffer(r)) + offset;
  }
  reduce_many(dst, src.data(), c.size, len, t, op, divisor);
}

namespace {

// Where this rank's own contribution is read from for a reduction into `out`: the caller's input
// where that is out itself or lies apart from it, not the copy this rank has just written into its
// window, which the peers are reading at the same moment: reading that copy back made a two-rank
// all-reduce of 8 KiB about 1.5x slower (docs/algorithms.md, "One-shot"). An input that partly
// overlaps out is read from the window copy, as reduce_many may not read a source that the output
// partly covers.
const uint8_t* own_source(const void* in, const void* out, size_t bytes) {
  const auto i = reinterpret_cast<uintptr_t>(in), o = reinterpret_cast<uintptr_t>(out);
  return in == out || i + bytes <= o || o + bytes <= i ? static_cast<const uint8_t*>(in) : nullptr;
}

// An all-reduce's result into out, each chunk as the ring cuts it folded in the ring's order;
// this rank's contribution from `own` unless null.
void reduce_all_chunks(const Call& c, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                       const uint8_t* own) {
  if (count == 0) return;
  SmallArray<const void*> by_rank(static_cast<size_t>(c.size));
  for (int r = 0; r < c.size; ++r) by_rank[r] = r == c.rank && own != nullptr ? own : c.w.buffer(r);
  const size_t chunk = (count + c.size - 1) / c.size;
  reduce_rotated(out, by_rank.data(), c.size, count, chunk, t, op, divisor);
}

}  // namespace

void allreduce(const Call& c, const void* in, void* out, size_t count, DType t, RedOp op,
               int64_t divisor) {
  const size_t bytes = count * dtype_size(t);
  exchange(c, bytes, [&](uint8_t* mine) { copy(mine, in, bytes, c.stream); });
  reduce_all_chunks(c, out, count, t, op, divisor, own_source(in, out, bytes));
}

void reduce_scatter(const Call& c, const Chunks& in, void* out, size_t count, DType t, RedOp op,
                    int64_t divisor) {
  const size_t bytes = count * dtype_size(t);
  exchange(c, bytes * c.size, [&](uint8_t* mine) {
    for (int p = 0; p < c.size; ++p) copy(mine + p * bytes, in.at(p), bytes);
  });
  reduce_chunk(c, out, c.rank, c.rank * bytes, count, t, op, divisor);
}

void all_gather(const void* in, const Call& c, const Chunks& out, size_t count, DType t) {
  const size_t bytes = count * dtype_size(t);
  exchange(c, bytes, [&](uint8_t* mine) { copy(mine, in, bytes); });
  for (int p = 0; p < c.size; ++p) {
    // Its own chunk from its input, unless the input is that chunk already.
    const void* from = p == c.rank ? in : c.w.buffer(p);
    if (out.at(p) != from) copy(out.at(p), from, bytes);
  }
}

void broadcast(const Call& c, void* buf, size_t count, DType t, int root) {
  const size_t bytes = count * dtype_size(t);
  exchange(c, bytes, [&](uint8_t* mine) {
    if (c.rank == root) copy(mine, buf, bytes);
  });
  if (c.rank != root) copy(buf, c.w.buffer(root), bytes);
}

void reduce(const Call& c, const void* in, void* out, size_t count, DType t, RedOp op,
            int64_t divisor, int root) {
  const size_t bytes = count * dtype_size(t);
  exchange(c, bytes, [&](uint8_t* mine) { copy(mine, in, bytes); });
  if (c.rank == root) reduce_all_chunks(c, out, count, t, op, divisor, own_source(in, out, bytes));
}

void barrier(const Call& c) {
  exchange(c, 0, [](uint8_t*) {});
}

}  // namespace ringreduce::oneshot

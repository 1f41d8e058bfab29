#include "algo/device_oneshot.h"

#include <algorithm>

#include "common/error.h"
#include "reduce/reduce_cuda.h"

namespace ringreduce {

void DeviceOneShot::allreduce(const void* in, void* out, size_t count, DType t, RedOp op,
                              int64_t divisor, uint32_t tag, CUstream_st* s) {
  const int n = w_.size();
  RR_CHECK(n <= kMaxRanks, "ringreduce cuda: the one-shot all-reduce takes at most ", kMaxRanks,
           " ranks, not ", n);
  const size_t es = dtype_size(t);
  const size_t per_chunk = w_.slot_bytes() / es;
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const window::Print print{count, meta_of(t, op), tag};
  const void* row0[kMaxRanks];
  const void* row1[kMaxRanks];
  for (int r = 0; r < n; ++r) {
    row0[r] = w_.slot(r, 0);
    row1[r] = w_.slot(r, 1);
  }
  const int me = w_.rank();
  for (size_t done = 0; done < count;) {
    const size_t m = std::min(per_chunk, count - done);
    // Gated on the abort word: after an abort released this rank's waits, it must not refill a
    // slot that a late peer may still be reading.
    cuda::copy_turn(w_.slot(me, 0), w_.slot(me, 1), src + done * es, m * es, w_.abort_word(),
                    w_.turn_word(), s);
    w_.post(print, s);
    w_.wait_peers(s);
    w_.admit(s);
    // After the admit, the turn's slot is ((turn - 1) & 1): lag 1.
    cuda::reduce_turn(dst + done * es, row0, row1, n, m, t, op, w_.abort_word(), w_.turn_word(), 1, s);
    done += m;
  }
  if (divisor > 1 && count > 0) cuda::divide(out, out, count, t, divisor, s);
}

}  // namespace ringreduce

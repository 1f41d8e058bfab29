#include "algo/device_oneshot.h"

#include <algorithm>

#include "common/error.h"
#include "reduce/reduce_cuda.h"

namespace ringreduce {

void DeviceOneShot::allreduce(const void* in, void* out, size_t count, DType t, RedOp op,
                              int64_t divisor, CUstream_st* s) {
  const int n = w_.size();
  RR_CHECK(n <= kMaxRanks, "ringreduce cuda: the one-shot all-reduce takes at most ", kMaxRanks,
           " ranks, not ", n);
  const size_t es = dtype_size(t);
  const size_t per_chunk = w_.slot_bytes() / es;
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t done = 0; done < count;) {
    const size_t m = std::min(per_chunk, count - done);
    const uint32_t seq = ++seq_;
    const int which = static_cast<int>(seq & 1);
    // Gated on the abort word: after an abort released this rank's waits, it must not refill a
    // slot that a late peer may still be reading.
    cuda::copy_unless(w_.slot(w_.rank(), which), src + done * es, m * es, w_.abort_word(), s);
    w_.post(seq, s);
    w_.wait_peers(seq, s);
    const void* staged[kMaxRanks];
    for (int r = 0; r < n; ++r) staged[r] = w_.slot(r, which);
    cuda::reduce_inputs(dst + done * es, staged, n, m, t, op, w_.abort_word(), s);
    done += m;
  }
  if (divisor > 1 && count > 0) cuda::divide(out, out, count, t, divisor, s);
}

}  // namespace ringreduce

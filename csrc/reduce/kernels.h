// The element-wise work of a ring op, behind one interface: where the data lives decides which
// kernels run it. The message algorithms (csrc/algo/) are written once against this and the
// Transport; over host memory they get cpu_kernels(), over device memory a CudaKernels bound to
// its stream (reduce/reduce_cuda.h).
//
// The calls have the contracts of the free functions in reduce/reduce.h. Device kernels are only
// queued when the call returns; the transport that publishes a slot waits for them first (see
// transport/cuda_ipc/), so the ring needs no fences of its own.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace ringreduce {

class Kernels {
 public:
  virtual ~Kernels() = default;
  // dst[i] = a[i] op b[i]; dst may be a or b exactly.
  virtual void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) = 0;
  // dst[i] = src[i] / divisor (AVG's last step); dst may be src.
  virtual void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor) = 0;
  // `streaming`: dst is the caller's output, not read again inside the op (a hint).
  virtual void copy(void* dst, const void* src, size_t bytes, bool streaming) = 0;
  // reduce(dst, a, b), divide(dst, dst) unless divisor is 1, then copy(out, dst): the last
  // reduce-scatter step of an all-reduce, whose result goes to the next rank (dst) and to the
  // output (out, which may be b exactly). The host kernels do it in one pass; these three calls are
  // the contract, and what kernels without a fused version run.
  virtual void reduce_and_copy(void* dst, void* out, const void* a, const void* b, size_t n,
                               DType t, RedOp op, int64_t divisor) {
    reduce(dst, a, b, n, t, op);
    if (divisor != 1) divide(dst, dst, n, t, divisor);
    copy(out, dst, n * dtype_size(t), false);
  }
  // reduce() and reduce_and_copy() whose `dst` is a slot that a peer reads next, in an op too large
  // to stay in cache (algo/handoff.h): the host kernels write dst with non-temporal stores,
  // so the reader fetches it from memory instead of from the writer's cache, which costs far more
  // where the two cores share no cache (docs/design.md, "Hand-offs between cores"). Same results,
  // bit for bit; kernels without such stores run the plain calls.
  virtual void reduce_streamed(void* dst, const void* a, const void* b, size_t n, DType t,
                               RedOp op) {
    reduce(dst, a, b, n, t, op);
  }
  virtual void reduce_and_copy_streamed(void* dst, void* out, const void* a, const void* b,
                                        size_t n, DType t, RedOp op, int64_t divisor) {
    reduce_and_copy(dst, out, a, b, n, t, op, divisor);
  }
};

// The host kernels of reduce/reduce.h; one instance serves every ring.
Kernels& cpu_kernels();

}  // namespace ringreduce

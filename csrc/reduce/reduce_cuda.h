// Reduction and copy kernels over raw device pointers (CUDA), queued on a stream.
//
// The same contracts as reduce/reduce.h, on device memory: every dtype and op the CPU path has,
// fp16/bf16 computed in fp32 and rounded to nearest even once, integer division truncating toward
// zero, any alignment and count. No torch types: callers pass a cudaStream_t (declared here
// without the CUDA headers, so that host code that only passes a stream around needs none).
// Launch errors throw ringreduce::Error with cudaGetErrorString's text.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "reduce/kernels.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ringreduce {
namespace cuda {

using Stream = CUstream_st*;

// dst[i] = a[i] op b[i] for i in [0, n), queued on `s`. dst may be a or b exactly.
void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op, Stream s);
// dst[i] = ((in[0][i] op in[1][i]) op in[2][i]) ... over `nin` inputs (1 to 8) in that order,
// each step rounded as reduce() rounds it, queued on `s`. dst may be one of the inputs exactly.
// `abort` (device-readable, or null): when it reads nonzero as the kernel starts, dst is left
// untouched (see transport/cuda_ipc/device_window.h).
void reduce_inputs(void* dst, const void* const* in, int nin, size_t n, DType t, RedOp op,
                   const volatile uint32_t* abort, Stream s);
// reduce_inputs over one of two rows of inputs, chosen on the device as each block starts: row
// (*turn - lag) & 1 (`turn` device-readable). A device window's staging slots alternate by its
// turn counter, which advances on the device (transport/cuda_ipc/device_window.h), so a call
// queued once, or captured in a CUDA graph and replayed, reads the slot of the turn it runs in.
void reduce_turn(void* dst, const void* const* row0, const void* const* row1, int nin, size_t n, DType t,
                 RedOp op, const volatile uint32_t* abort, const volatile uint32_t* turn, uint32_t lag,
                 Stream s);
// dst[i] = src[i] / divisor, queued on `s` (bool rejected). dst may be src.
void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor, Stream s);
// Device-to-device copy of `bytes`, queued on `s`.
void copy(void* dst, const void* src, size_t bytes, Stream s);
// The same as a kernel that copies nothing when `abort` (device-readable) reads nonzero as it
// starts: a staging copy queued behind a wait that an abort released.
void copy_unless(void* dst, const void* src, size_t bytes, const volatile uint32_t* abort, Stream s);
// copy_unless into dst0 or dst1, chosen as reduce_turn chooses a row, with lag 0.
void copy_turn(void* dst0, void* dst1, const void* src, size_t bytes, const volatile uint32_t* abort,
               const volatile uint32_t* turn, Stream s);

// The ring's kernels for buffers on one device, queued on one stream (owned by the caller).
class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(Stream s) : s_(s) {}
  void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) override {
    cuda::reduce(dst, a, b, n, t, op, s_);
  }
  void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor) override {
    cuda::divide(dst, src, n, t, divisor, s_);
  }
  void copy(void* dst, const void* src, size_t bytes, bool) override { cuda::copy(dst, src, bytes, s_); }
  Stream stream() const { return s_; }

 private:
  Stream s_;
};

}  // namespace cuda
}  // namespace ringreduce

// Reduction and copy kernels over raw pointers (CPU).
//
// The ring calls these on one slice at a time, so each call is a few hundred KiB at most and the
// data is usually in cache; they are written as plain loops over restrict pointers that the
// compiler vectorises, with one dtype/op dispatch point in reduce_cpu.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace ringreduce {

// dst[i] = a[i] op b[i] for i in [0, n). dst may be a or b (exactly), but must not otherwise overlap
// them. fp16/bf16 are computed in fp32 and rounded to nearest even once. Throws ringreduce::Error if
// op is not defined on t (see unsupported_reason).
void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op);

// dst[i] = src[i] / divisor (the last step of AVG). Floating and complex types divide in their own
// precision (fp16/bf16 in fp32); integer types truncate toward zero, as C++ and NCCL do. bool is
// rejected. dst may be src.
void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor);

// The last reduce-scatter step of an all-reduce in one pass: dst[i] = out[i] = a[i] op b[i], then
// divided by `divisor` unless it is 1 (AVG). Each element is rounded to t after the op and again
// after the division, so the result is bit for bit that of reduce(), divide() and copy() in turn,
// without reading dst back twice. b may be out exactly (an in-place all-reduce); no other pair of
// the four buffers may overlap.
void reduce_and_copy(void* dst, void* out, const void* a, const void* b, size_t n, DType t, RedOp op,
                     int64_t divisor);

// reduce() with dst written by non-temporal stores (through a block in L1): for a destination that
// another core reads next and that would not stay in cache anyway. Same contract and bits.
void reduce_streamed(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op);

// dst[i] = (src[0][i] op src[1][i] op ... op src[m-1][i]), left to right, divided by `divisor`
// unless it is 1 (AVG): the reduction of the one-shot and two-shot algorithms, which read every
// rank's contribution at once. Bit for bit what reduce() m-1 times and then divide() give (fp16 and
// bf16 are rounded after every step, as the ring's partial sums are), in one pass. dst may be one of
// the sources exactly (each block is read from every source before it is written), but must not
// otherwise overlap them. m >= 1.
void reduce_many(void* dst, const void* const* src, int m, size_t n, DType t, RedOp op,
                 int64_t divisor);

// reduce_many over one op's chunks, each folded in its own rotation of the sources: the n elements
// are cut into chunks of `chunk` (the last one shorter), and chunk c of dst is reduce_many of
// chunk c of src[(c+1) % m], src[(c+2) % m], ..., src[c % m]: the ring's order, in which chunk c's
// partial sum starts after rank c and ends there (src indexed by rank). The same bits as a
// reduce_many per chunk, with one check and one dtype dispatch for the whole op: a one-shot
// all-reduce of 1 KiB between two ranks spent more instructions on a call per chunk than on its
// additions. Aliasing as for reduce_many, over the whole range. chunk > 0.
void reduce_rotated(void* dst, const void* const* src, int m, size_t n, size_t chunk, DType t,
                    RedOp op, int64_t divisor);

// dst[i] = src[i] * factor (PREMUL_SUM's pre-scaling). Floating and complex types only.
void scale(void* dst, const void* src, size_t n, DType t, double factor);

// memcpy for slices. `streaming` asks for non-temporal stores: for a dst that will not be read
// again soon from this core's cache (a large output; a slot that another core reads next, where
// algo/handoff.h finds them faster by measuring both).
void copy(void* dst, const void* src, size_t bytes, bool streaming = false);

// Which copy of the hot loops this process runs, as chosen at load time from the CPU: "avx2",
// or "baseline (sse2)"; with ", f16c" where fp16 conversions use it. For RINGREDUCE_DEBUG and
// `python -m ringreduce.info`.
const char* simd_level();

}  // namespace ringreduce

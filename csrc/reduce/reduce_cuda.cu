// CUDA reduction kernels.
//
// The same shape as reduce_cpu.cpp: one kernel template over an element kind (how an element is
// stored, in which type it is computed) and an op functor, one map kernel for divide(), and
// with_kind() / with_op() below as the only places that turn the runtime tags into types.
//
// Every result must be bit-identical to the CPU kernels' on the same inputs: a job can mix ranks
// whose slices are reduced on the host with ranks whose slices are reduced here, and every rank
// must end with the same bits. Three things differ between a GPU and an x86 core unless this file
// takes care of them:
//
// - Contraction. nvcc fuses a*b+c into an FMA by default, which rounds once instead of twice (the
//   complex product). The arithmetic goes through the __f*_rn / __d*_rn intrinsics, which are
//   never fused whatever the flags; CMake passes --fmad=false as well for anything else.
// - NaN results. A GPU does not propagate NaN payloads (an op that yields a NaN yields its one
//   canonical NaN); x86 SSE/AVX returns the first NaN operand with its quiet bit set, and for an
//   invalid op (inf - inf, 0 * inf) the "default NaN", negative (0xffc00000). x86_nan() rebuilds
//   x86's answer whenever a result is NaN. When both operands are NaN the CPU's answer depends on
//   the order in which its compiler placed the operands of a commutative op (it differs between
//   its own in-place and out-of-place loops), so there is no one answer to match; here the first
//   operand as written wins.
// - fp16/bf16 NaNs. The CPU widens fp16 with F16C semantics (a NaN keeps its payload and comes out
//   quiet) and narrows keeping the payload's top bits; the hardware conversions are not documented
//   to keep payloads, so NaNs take an integer path (the formulas of reduce/half.h) and the rest the
//   hardware's exact, round-to-nearest-even conversions.
//
// Never build this file with --use_fast_math (or -ftz=true, -prec-div=false): the NaN checks need
// IEEE comparisons, and flushed subnormals or approximate division would change the bits.

#include "reduce/reduce_cuda.h"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "common/error.h"
#include "reduce/kinds.h"
#include "reduce/ops.h"

static_assert(std::is_same_v<ringreduce::cuda::Stream, cudaStream_t>,
              "reduce_cuda.h's Stream must be cudaStream_t");

namespace ringreduce {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// IEEE arithmetic as x86 does it

__device__ __forceinline__ bool is_nan(float x) { return x != x; }
__device__ __forceinline__ bool is_nan(double x) { return x != x; }

__device__ __forceinline__ float quiet(float x) {
  return __uint_as_float(__float_as_uint(x) | 0x00400000u);
}
__device__ __forceinline__ double quiet(double x) {
  return __longlong_as_double(static_cast<long long>(
      static_cast<unsigned long long>(__double_as_longlong(x)) | 0x0008000000000000ull));
}

template <class R>
__device__ __forceinline__ R default_nan();
template <>
__device__ __forceinline__ float default_nan<float>() {
  return __uint_as_float(0xFFC00000u);
}
template <>
__device__ __forceinline__ double default_nan<double>() {
  return __longlong_as_double(static_cast<long long>(0xFFF8000000000000ull));
}

// What an SSE/AVX instruction returns for `x op y` when the result is NaN. Only called on that
// (rare) path, so its branches cost nothing on ordinary data.
template <class R>
__device__ __forceinline__ R x86_nan(R x, R y) {
  if (is_nan(x)) return quiet(x);
  if (is_nan(y)) return quiet(y);
  return default_nan<R>();
}

// One arithmetic op, rounded to nearest with no contraction (the explicit _rn intrinsic), whose
// NaN result is the one x86 gives.
#define RR_X86_ARITH(T, name, rounded)                       \
  __device__ __forceinline__ T name(T x, T y) {              \
    const T z = rounded(x, y);                               \
    return is_nan(z) ? x86_nan(x, y) : z;                    \
  }
RR_X86_ARITH(float, add, __fadd_rn)
RR_X86_ARITH(float, sub, __fsub_rn)
RR_X86_ARITH(float, mul, __fmul_rn)
RR_X86_ARITH(float, div, __fdiv_rn)
RR_X86_ARITH(double, add, __dadd_rn)
RR_X86_ARITH(double, sub, __dsub_rn)
RR_X86_ARITH(double, mul, __dmul_rn)
RR_X86_ARITH(double, div, __ddiv_rn)
#undef RR_X86_ARITH

// ---------------------------------------------------------------------------------------------
// Element kinds (as in reduce_cpu.cpp: Store is what lies in memory, Math what the op runs in)

using namespace ops;  // the element traits and op functors (reduce/ops.h)

// The textbook formulas, in the CPU's order of operations, so that each rounding is the same.
template <class R>
__device__ __forceinline__ Complex<R> add(Complex<R> x, Complex<R> y) {
  return {add(x.re, y.re), add(x.im, y.im)};
}
template <class R>
__device__ __forceinline__ Complex<R> mul(Complex<R> x, Complex<R> y) {
  return {sub(mul(x.re, y.re), mul(x.im, y.im)), add(mul(x.re, y.im), mul(x.im, y.re))};
}

template <class T>
struct Native {
  using Store = T;
  using Math = T;
  __device__ static Math load(Store v) { return v; }
  __device__ static Store store(Math v) { return v; }
};

struct Half {
  using Store = uint16_t;
  using Math = float;
  __device__ static float load(uint16_t h) {
    // NaNs by hand: F16C keeps the payload and sets the quiet bit (and the CPU kernels match
    // F16C), which the hardware conversion is not documented to do.
    if ((h & 0x7FFFu) > 0x7C00u) {
      return __uint_as_float((uint32_t(h & 0x8000u) << 16) | 0x7FC00000u |
                             (uint32_t(h & 0x03FFu) << 13));
    }
    return __half2float(__ushort_as_half(h));
  }
  __device__ static uint16_t store(float f) {
    const uint32_t w = __float_as_uint(f);
    if ((w & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep the payload's top bits, quiet
      return uint16_t(((w >> 16) & 0x8000u) | 0x7E00u | ((w >> 13) & 0x03FFu));
    }
    return __half_as_ushort(__float2half_rn(f));
  }
};

struct BHalf {
  using Store = uint16_t;
  using Math = float;
  // A bf16 is the top half of a float: widening is exact, and (as on the CPU) keeps a signalling
  // NaN signalling until an op or the narrowing quiets it.
  __device__ static float load(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
  // reduce/half.h's float_to_bf16, integer only, so that it is the CPU's rounding by construction.
  __device__ static uint16_t store(float f) {
    const uint32_t w = __float_as_uint(f);
    const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
    const uint32_t nan = (w >> 16) | 0x0040u;
    return uint16_t((w & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
  }
};

// Bytes, not C++ bool: any nonzero byte is true, results are 0/1 (as on the CPU).
struct Bool {
  using Store = uint8_t;
  using Math = bool;
  __device__ static Math load(Store v) { return v != 0; }
  __device__ static Store store(Math v) { return static_cast<Store>(v); }
};

// ops.h's Sum and Prod compute with the x86-exact primitives above.
struct DeviceArith {
  template <class M>
  __device__ static M add(M a, M b) { return cuda::add(a, b); }
  template <class M>
  __device__ static M mul(M a, M b) { return cuda::mul(a, b); }
};

using Arith = DeviceArith;  // kinds.h's op list computes with it

// Element maps for divide(). The divisor arrives already converted to the Math type (on the
// host, with the same static_cast as the CPU), so the kernels only divide.
template <class M>
struct DivideBy {
  M d;
  __device__ M operator()(M x) const { return div(x, d); }
};
template <class R>
struct DivideBy<Complex<R>> {
  R d;
  __device__ Complex<R> operator()(Complex<R> x) const { return {div(x.re, d), div(x.im, d)}; }
};
// Truncating toward zero through int64, as the CPU does (see IntDivideBy there); x / -1 gets the
// wrapping negation instead, where the quotient of the type's minimum would not fit.
template <class M>
struct IntDivideBy {
  int64_t d;
  __device__ M operator()(M x) const { return static_cast<M>(static_cast<int64_t>(x) / d); }
};
template <class M>
struct IntNegate {
  __device__ M operator()(M x) const { return static_cast<M>(Wide<M>(0) - Wide<M>(x)); }
};

// ---------------------------------------------------------------------------------------------
// Kernels
//
// The body moves 16 bytes per load and store, the widest access a thread has, so that a warp
// touches whole 128-byte lines with a quarter of the instructions of 4-byte accesses. That needs
// dst, a and b at the same offset modulo 16: then a scalar head brings all three to a 16-byte
// boundary at once, and a scalar tail finishes the count. Pointers misaligned differently get
// the scalar loop throughout (Wide16 = false, one element per "pack").
//
// Each thread has kUnroll packs of each input in flight per iteration, all loads issued before
// the first result is needed: HBM reaches full bandwidth only with several MiB outstanding, and the
// registers a pack takes (not the thread count) limit how many threads an SM holds. The loop
// grid-strides over a grid capped at what the device holds at once (resident_blocks): blocks
// beyond that would only queue behind the first wave, and one resident wave sweeps the buffer
// contiguously, iteration by iteration.

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// V elements that are loaded and stored together. A wide pack (V > 1, and the 16-byte
// complex128) lies on a 16-byte boundary and moves as one 128-bit access through `raw`; nvcc
// does not reliably keep a memcpy of the elements one access.
template <class S, int V, bool Wide16>
union Pack {
  S e[V];
};
template <class S, int V>
union Pack<S, V, true> {
  static_assert(sizeof(S) * V == 16, "a wide pack is 16 bytes");
  uint4 raw;
  S e[V];
};

template <class S, int V, bool Wide16>
__device__ __forceinline__ Pack<S, V, Wide16> load_pack(const S* p) {
  Pack<S, V, Wide16> out;
  if constexpr (Wide16) out.raw = *reinterpret_cast<const uint4*>(p);
  else out.e[0] = *p;
  return out;
}
template <class S, int V, bool Wide16>
__device__ __forceinline__ void store_pack(S* p, const Pack<S, V, Wide16>& v) {
  // __stwb is a plain (write-back) store; as an intrinsic it stays one 128-bit store, where nvcc
  // splits some assignments of the union into four.
  if constexpr (Wide16) __stwb(reinterpret_cast<uint4*>(p), v.raw);
  else *p = v.e[0];
}

template <class K, class Op>
__device__ __forceinline__ typename K::Store reduce_elem(typename K::Store a, typename K::Store b) {
  return K::store(Op::apply(K::load(a), K::load(b)));
}

// dst[i] = a[i] op b[i]. The first `head` elements and the `tail` after the nvec packs are scalar,
// one per thread of the first few threads. No __restrict__: dst may be a or b, which is safe here
// because each element is read and then written by the same thread, and no thread reads an
// element another one writes.
template <class K, class Op, bool Wide16>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(typename K::Store* dst, const typename K::Store* a, const typename K::Store* b,
                  size_t head, size_t nvec, size_t tail) {
  using S = typename K::Store;
  constexpr int V = Wide16 ? int(16 / sizeof(S)) : 1;
  using P = Pack<S, V, Wide16>;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  S* const d = dst + head;
  const S* const x = a + head;
  const S* const y = b + head;

  // The last iteration is partial (guarded per pack) rather than a scalar remainder loop: its
  // loads then still go out together instead of one round trip after another.
  for (size_t i = tid; i < nvec; i += kUnroll * stride) {
    P px[kUnroll], py[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) {
        px[u] = load_pack<S, V, Wide16>(x + j * V);
        py[u] = load_pack<S, V, Wide16>(y + j * V);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) {
        P r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.e[k] = reduce_elem<K, Op>(px[u].e[k], py[u].e[k]);
        store_pack<S, V, Wide16>(d + j * V, r);
      }
    }
  }

  if (tid < head) {
    dst[tid] = reduce_elem<K, Op>(a[tid], b[tid]);
  } else if (tid < head + tail) {
    const size_t j = head + nvec * V + (tid - head);
    dst[j] = reduce_elem<K, Op>(a[j], b[j]);
  }
}

// dst[i] = ((in[0][i] op in[1][i]) op in[2][i]) ... in input order, each step rounded to the
// stored type as a chain of reduce_kernel calls would round it, so that the result has the bits a
// ring or the CPU kernels give for the same order. Laid out as reduce_kernel. When `abort` is set
// and reads nonzero at the start, nothing is written: a group aborted while the kernel was queued
// (a peer died before its input was there) leaves the caller's output as it was.
constexpr int kMaxInputs = 8;
// Whether `abort` (null: never) reads nonzero as the block starts; read once per block, by its
// first thread, so that every thread of a block does the same.
__device__ __forceinline__ bool block_sees_abort(const volatile uint32_t* abort) {
  if (!abort) return false;
  __shared__ uint32_t aborted;
  if (threadIdx.x == 0) aborted = *abort;
  __syncthreads();
  return aborted != 0;
}
// Which of two rows of buffers a block uses: row (*turn - lag) & 1, read once per block as the
// abort word is; row 0 when `turn` is null. A device window's turn counter advances on the
// device, so a kernel captured in a CUDA graph picks the right staging slot at every replay.
__device__ __forceinline__ int block_row(const volatile uint32_t* turn, uint32_t lag) {
  if (!turn) return 0;
  __shared__ uint32_t row;
  if (threadIdx.x == 0) row = (*turn - lag) & 1u;
  __syncthreads();
  return static_cast<int>(row);
}
template <class S>
struct Inputs {
  const S* p[kMaxInputs];
};
template <class K, class Op, bool Wide16>
__global__ void __launch_bounds__(kThreads)
    reduce_inputs_kernel(typename K::Store* dst, Inputs<typename K::Store> in0, Inputs<typename K::Store> in1,
                         int nin, size_t head, size_t nvec, size_t tail, const volatile uint32_t* abort,
                         const volatile uint32_t* turn, uint32_t lag) {
  using S = typename K::Store;
  constexpr int V = Wide16 ? int(16 / sizeof(S)) : 1;
  using P = Pack<S, V, Wide16>;
  if (block_sees_abort(abort)) return;
  // Each input picked from its row where it is used: both rows stay in parameter space, where a
  // runtime index costs nothing, rather than a row copied to local memory.
  const bool row1 = block_row(turn, lag) != 0;
  auto in = [&](int r) { return row1 ? in1.p[r] : in0.p[r]; };
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  S* const d = dst + head;
  for (size_t i = tid; i < nvec; i += kUnroll * stride) {
    P acc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) acc[u] = load_pack<S, V, Wide16>(in(0) + head + j * V);
    }
    for (int r = 1; r < nin; ++r) {
      P x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t j = i + u * stride;
        if (j < nvec) x[u] = load_pack<S, V, Wide16>(in(r) + head + j * V);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[u].e[k] = reduce_elem<K, Op>(acc[u].e[k], x[u].e[k]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) store_pack<S, V, Wide16>(d + j * V, acc[u]);
    }
  }
  size_t j = size_t(-1);
  if (tid < head) j = tid;
  else if (tid < head + tail) j = head + nvec * V + (tid - head);
  if (j != size_t(-1)) {
    S a = in(0)[j];
    for (int r = 1; r < nin; ++r) a = reduce_elem<K, Op>(a, in(r)[j]);
    dst[j] = a;
  }
}

// dst = src, `bytes` of them, in 16-byte units when both are 16-byte aligned (`wide`), else in
// bytes; nothing when `abort` reads nonzero as the kernel starts (reduce_inputs_kernel's rule).
// dst is dst0 or dst1 by block_row(turn, 0).
__global__ void __launch_bounds__(kThreads)
    copy_unless_kernel(uint8_t* dst0, uint8_t* dst1, const uint8_t* src, size_t bytes, bool wide,
                       const volatile uint32_t* abort, const volatile uint32_t* turn) {
  if (block_sees_abort(abort)) return;
  uint8_t* const dst = block_row(turn, 0) ? dst1 : dst0;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  if (wide) {
    const size_t n = bytes / 16;
    for (size_t i = tid; i < n; i += stride)
      __stwb(reinterpret_cast<uint4*>(dst) + i, reinterpret_cast<const uint4*>(src)[i]);
    return;
  }
  for (size_t i = tid; i < bytes; i += stride) dst[i] = src[i];
}

// dst[i] = f(src[i]), laid out as reduce_kernel. dst may be src.
template <class K, class F, bool Wide16>
__global__ void __launch_bounds__(kThreads)
    map_kernel(typename K::Store* dst, const typename K::Store* src, size_t head, size_t nvec,
               size_t tail, F f) {
  using S = typename K::Store;
  constexpr int V = Wide16 ? int(16 / sizeof(S)) : 1;
  using P = Pack<S, V, Wide16>;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  S* const d = dst + head;
  const S* const x = src + head;

  for (size_t i = tid; i < nvec; i += kUnroll * stride) {
    P px[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) px[u] = load_pack<S, V, Wide16>(x + j * V);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t j = i + u * stride;
      if (j < nvec) {
        P r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.e[k] = K::store(f(K::load(px[u].e[k])));
        store_pack<S, V, Wide16>(d + j * V, r);
      }
    }
  }

  if (tid < head) {
    dst[tid] = K::store(f(K::load(src[tid])));
  } else if (tid < head + tail) {
    const size_t j = head + nvec * V + (tid - head);
    dst[j] = K::store(f(K::load(src[j])));
  }
}

// ---------------------------------------------------------------------------------------------
// Launching

// How many blocks of `kernel` the current device holds at once, over all its SMs. The SM count and
// the occupancy are asked once per kernel and device (a ring launches once per slice, and the
// occupancy calculator is not free); a lock around a small map costs nothing beside a launch.
int resident_blocks(const void* kernel) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  RR_CHECK(err == cudaSuccess, "ringreduce cuda: cudaGetDevice failed: ", cudaGetErrorString(err));
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;  // (kernel, device) -> blocks
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find({kernel, dev});
  if (it != cache.end()) return it->second;
  int sms = 0, per_sm = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  RR_CHECK(err == cudaSuccess, "ringreduce cuda: cannot read the SM count of device ", dev, ": ",
           cudaGetErrorString(err));
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  RR_CHECK(err == cudaSuccess, "ringreduce cuda: cannot read a kernel's occupancy on device ", dev,
           ": ", cudaGetErrorString(err));
  const int blocks = std::max(1, sms * per_sm);
  cache.emplace(std::make_pair(kernel, dev), blocks);
  return blocks;
}

// How a call is cut into head, 16-byte packs and tail. Wide is false when the pointers' offsets
// modulo 16 differ (or are not a whole number of elements apart from the boundary): then
// everything is one scalar run.
struct Split {
  bool wide;
  size_t head, nvec, tail;
};

Split split(size_t n, size_t elem_size, std::initializer_list<const void*> ptrs) {
  const size_t off = reinterpret_cast<uintptr_t>(*ptrs.begin()) % 16;
  bool same = off % elem_size == 0;
  for (const void* p : ptrs) same = same && reinterpret_cast<uintptr_t>(p) % 16 == off;
  if (!same) return {false, 0, n, 0};
  const size_t per = 16 / elem_size;  // 1 for complex128
  const size_t head = std::min(n, (16 - off) % 16 / elem_size);
  const size_t nvec = (n - head) / per;
  return {true, head, nvec, n - head - nvec * per};
}

// Blocks for `items` packs: one pack per thread per unrolled step, at most one resident wave.
unsigned grid_for(const void* kernel, size_t items) {
  const size_t per_block = size_t(kThreads) * kUnroll;
  const size_t want = std::max<size_t>(1, (items + per_block - 1) / per_block);
  return static_cast<unsigned>(std::min<size_t>(want, size_t(resident_blocks(kernel))));
}

template <class K, class Op>
void launch_reduce(void* dst, const void* a, const void* b, size_t n, cudaStream_t s) {
  using S = typename K::Store;
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  const Split sp = split(n, sizeof(S), {dst, a, b});
  if (sp.wide) {
    const auto kernel = reduce_kernel<K, Op, true>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), sp.nvec), kThreads, 0, s>>>(
        d, x, y, sp.head, sp.nvec, sp.tail);
  } else {
    const auto kernel = reduce_kernel<K, Op, false>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), n), kThreads, 0, s>>>(d, x, y, 0, n,
                                                                                   0);
  }
}

// `in1` null: one row of inputs (in0), whatever `turn` says.
template <class K, class Op>
void launch_reduce_inputs(void* dst, const void* const* in0, const void* const* in1, int nin, size_t n,
                          const volatile uint32_t* abort, const volatile uint32_t* turn, uint32_t lag,
                          cudaStream_t s) {
  using S = typename K::Store;
  Inputs<S> ins0{}, ins1{};
  for (int r = 0; r < nin; ++r) {
    ins0.p[r] = static_cast<const S*>(in0[r]);
    ins1.p[r] = static_cast<const S*>(in1 ? in1[r] : in0[r]);
  }
  auto* d = static_cast<S*>(dst);
  // split() compares every pointer's offset modulo 16 with the first's.
  Split sp = split(n, sizeof(S), {dst, in0[0]});
  for (int r = 0; r < nin && sp.wide; ++r) {
    if (!split(n, sizeof(S), {dst, ins0.p[r]}).wide || !split(n, sizeof(S), {dst, ins1.p[r]}).wide) {
      sp = {false, 0, n, 0};
    }
  }
  if (!in1) turn = nullptr;
  if (sp.wide) {
    const auto kernel = reduce_inputs_kernel<K, Op, true>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), sp.nvec), kThreads, 0, s>>>(
        d, ins0, ins1, nin, sp.head, sp.nvec, sp.tail, abort, turn, lag);
  } else {
    const auto kernel = reduce_inputs_kernel<K, Op, false>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), n), kThreads, 0, s>>>(
        d, ins0, ins1, nin, 0, n, 0, abort, turn, lag);
  }
}

template <class K, class F>
void launch_map(void* dst, const void* src, size_t n, cudaStream_t s, F f) {
  using S = typename K::Store;
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(src);
  const Split sp = split(n, sizeof(S), {dst, src});
  if (sp.wide) {
    const auto kernel = map_kernel<K, F, true>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), sp.nvec), kThreads, 0, s>>>(
        d, x, sp.head, sp.nvec, sp.tail, f);
  } else {
    const auto kernel = map_kernel<K, F, false>;
    kernel<<<grid_for(reinterpret_cast<const void*>(kernel), n), kThreads, 0, s>>>(d, x, 0, n, 0,
                                                                                   f);
  }
}

// ---------------------------------------------------------------------------------------------
// The dispatch point: the tags to kinds and op functors as reduce/kinds.h lists them

template <class F>
void with_kind(DType t, const char* what, F&& f) {
  switch (t) {
    RINGREDUCE_DTYPES(RINGREDUCE_KIND_CASE)
  }
  throw Error(
      detail::cat("ringreduce cuda ", what, ": unknown dtype tag ", static_cast<unsigned>(t)));
}

template <class F>
void with_op(RedOp op, F&& f) {
  switch (op) {
    RINGREDUCE_REDUCE_OPS(RINGREDUCE_OP_CASE)
  }
  throw Error(detail::cat("ringreduce cuda reduce: unknown op tag ", static_cast<unsigned>(op)));
}

// Checks shared by reduce and divide, mirroring the CPU's. Element alignment is new here: a GPU
// faults on a misaligned load where an x86 core only slows down. Torch tensors and slices of them
// are always aligned to their element type (and complex128 only needs 8 bytes).
void check_buffer(const char* what, const void* p, size_t elem_size, DType t) {
  const size_t align = std::min<size_t>(elem_size, 8);
  RR_CHECK(reinterpret_cast<uintptr_t>(p) % align == 0, "ringreduce cuda ", what, " (",
           dtype_name(t), "): buffer ", p, " is not aligned to ", align, " bytes");
}

void check_no_partial_overlap(const char* what, const void* x, const void* y, size_t bytes,
                              DType t) {
  const auto px = reinterpret_cast<uintptr_t>(x);
  const auto py = reinterpret_cast<uintptr_t>(y);
  RR_CHECK(px == py || px + bytes <= py || py + bytes <= px, "ringreduce cuda ", what, " (",
           dtype_name(t), "): output overlaps an input without being the same buffer (", x,
           " and ", y, ", ", bytes, " bytes)");
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op, Stream s) {
  if (const char* why = unsupported_reason(t, op)) {
    throw Error(detail::cat("ringreduce cuda reduce: ", redop_name(op), " is not supported on ",
                            dtype_name(t), ": ", why));
  }
  if (n == 0) return;
  RR_CHECK(dst && a && b, "ringreduce cuda reduce (", redop_name(op), ", ", dtype_name(t),
           "): null buffer for ", n, " elements");
  const size_t es = dtype_size(t);
  for (const void* p : {static_cast<const void*>(dst), a, b}) check_buffer("reduce", p, es, t);
  check_no_partial_overlap("reduce", dst, a, n * es, t);
  check_no_partial_overlap("reduce", dst, b, n * es, t);

  with_kind(t, "reduce", [&](auto kind) {
    using K = decltype(kind);
    with_op(op, [&](auto op_tag) {
      using Op = decltype(op_tag);
      if constexpr (supported<K, Op>()) {
        launch_reduce<K, Op>(dst, a, b, n, s);
      } else {
        throw Error(detail::cat("ringreduce cuda reduce: internal error: no kernel for ",
                                redop_name(op), " on ", dtype_name(t)));
      }
    });
  });
  const cudaError_t err = cudaGetLastError();
  RR_CHECK(err == cudaSuccess, "ringreduce cuda reduce (", redop_name(op), ", ", dtype_name(t),
           ", ", n, " elements): kernel launch failed: ", cudaGetErrorString(err));
}

namespace {

void reduce_rows(void* dst, const void* const* in0, const void* const* in1, int nin, size_t n, DType t,
                 RedOp op, const volatile uint32_t* abort, const volatile uint32_t* turn, uint32_t lag,
                 Stream s) {
  if (const char* why = unsupported_reason(t, op)) {
    throw Error(detail::cat("ringreduce cuda reduce_inputs: ", redop_name(op), " is not supported on ",
                            dtype_name(t), ": ", why));
  }
  RR_CHECK(nin >= 1 && nin <= kMaxInputs, "ringreduce cuda reduce_inputs: ", nin,
           " inputs (1 to ", kMaxInputs, ")");
  if (n == 0) return;
  const size_t es = dtype_size(t);
  RR_CHECK(dst, "ringreduce cuda reduce_inputs: null output for ", n, " elements");
  check_buffer("reduce_inputs", dst, es, t);
  for (const void* const* row : {in0, in1}) {
    if (!row) continue;
    for (int r = 0; r < nin; ++r) {
      RR_CHECK(row[r], "ringreduce cuda reduce_inputs: input ", r, " is null");
      check_buffer("reduce_inputs", row[r], es, t);
      check_no_partial_overlap("reduce_inputs", dst, row[r], n * es, t);
    }
  }
  with_kind(t, "reduce_inputs", [&](auto kind) {
    using K = decltype(kind);
    with_op(op, [&](auto op_tag) {
      using Op = decltype(op_tag);
      if constexpr (supported<K, Op>()) {
        launch_reduce_inputs<K, Op>(dst, in0, in1, nin, n, abort, turn, lag, s);
      } else {
        throw Error(detail::cat("ringreduce cuda reduce_inputs: internal error: no kernel for ",
                                redop_name(op), " on ", dtype_name(t)));
      }
    });
  });
  const cudaError_t err = cudaGetLastError();
  RR_CHECK(err == cudaSuccess, "ringreduce cuda reduce_inputs (", redop_name(op), ", ", dtype_name(t),
           ", ", n, " elements, ", nin, " inputs): kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void reduce_inputs(void* dst, const void* const* in, int nin, size_t n, DType t, RedOp op,
                   const volatile uint32_t* abort, Stream s) {
  reduce_rows(dst, in, nullptr, nin, n, t, op, abort, nullptr, 0, s);
}

void reduce_turn(void* dst, const void* const* row0, const void* const* row1, int nin, size_t n, DType t,
                 RedOp op, const volatile uint32_t* abort, const volatile uint32_t* turn, uint32_t lag,
                 Stream s) {
  RR_CHECK(row1 && turn, "ringreduce cuda reduce_turn: a second row and a turn counter are needed");
  reduce_rows(dst, row0, row1, nin, n, t, op, abort, turn, lag, s);
}

void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor, Stream s) {
  RR_CHECK(t != DType::Bool, "ringreduce cuda divide: bool tensors cannot be divided (an average "
                             "of bools is not a bool)");
  RR_CHECK(divisor != 0, "ringreduce cuda divide (", dtype_name(t), "): divisor is zero");
  if (n == 0) return;
  RR_CHECK(dst && src, "ringreduce cuda divide (", dtype_name(t), "): null buffer for ", n,
           " elements");
  const size_t es = dtype_size(t);
  check_buffer("divide", dst, es, t);
  check_buffer("divide", src, es, t);
  check_no_partial_overlap("divide", dst, src, n * es, t);

  with_kind(t, "divide", [&](auto kind) {
    using K = decltype(kind);
    using M = typename K::Math;
    if constexpr (kIsBool<M>) {
      // Rejected above; Bool only reaches here through the generic lambda.
    } else if constexpr (kIsInt<M>) {
      if (divisor == -1) launch_map<K>(dst, src, n, s, IntNegate<M>{});
      else launch_map<K>(dst, src, n, s, IntDivideBy<M>{divisor});
    } else if constexpr (IsComplex<M>::value) {
      using R = decltype(M::re);
      launch_map<K>(dst, src, n, s, DivideBy<M>{static_cast<R>(divisor)});
    } else {
      launch_map<K>(dst, src, n, s, DivideBy<M>{static_cast<M>(divisor)});
    }
  });
  const cudaError_t err = cudaGetLastError();
  RR_CHECK(err == cudaSuccess, "ringreduce cuda divide (", dtype_name(t), " by ", divisor, ", ", n,
           " elements): kernel launch failed: ", cudaGetErrorString(err));
}

namespace {

void copy_gated(void* dst0, void* dst1, const void* src, size_t bytes, const volatile uint32_t* abort,
                const volatile uint32_t* turn, Stream s) {
  const char* what = turn ? "copy_turn" : "copy_unless";
  RR_CHECK(dst0 && dst1 && src && abort, "ringreduce cuda ", what, ": null buffer for ", bytes, " bytes");
  const auto ps = reinterpret_cast<uintptr_t>(src);
  bool wide = ps % 16 == 0 && bytes % 16 == 0;
  for (void* dst : {dst0, dst1}) {
    const auto pd = reinterpret_cast<uintptr_t>(dst);
    RR_CHECK(pd + bytes <= ps || ps + bytes <= pd, "ringreduce cuda ", what, ": buffers overlap (", dst,
             " and ", src, ", ", bytes, " bytes)");
    wide = wide && pd % 16 == 0;
  }
  const auto kernel = copy_unless_kernel;
  const unsigned grid = grid_for(reinterpret_cast<const void*>(kernel), wide ? bytes / 16 : bytes);
  kernel<<<grid, kThreads, 0, s>>>(static_cast<uint8_t*>(dst0), static_cast<uint8_t*>(dst1),
                                  static_cast<const uint8_t*>(src), bytes, wide, abort, turn);
  const cudaError_t err = cudaGetLastError();
  RR_CHECK(err == cudaSuccess, "ringreduce cuda ", what, " (", bytes,
           " bytes): kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void copy_unless(void* dst, const void* src, size_t bytes, const volatile uint32_t* abort, Stream s) {
  if (bytes == 0 || dst == src) return;
  copy_gated(dst, dst, src, bytes, abort, nullptr, s);
}

void copy_turn(void* dst0, void* dst1, const void* src, size_t bytes, const volatile uint32_t* abort,
               const volatile uint32_t* turn, Stream s) {
  if (bytes == 0) return;
  RR_CHECK(turn, "ringreduce cuda copy_turn: no turn counter");
  copy_gated(dst0, dst1, src, bytes, abort, turn, s);
}

void copy(void* dst, const void* src, size_t bytes, Stream s) {
  if (bytes == 0 || dst == src) return;
  RR_CHECK(dst && src, "ringreduce cuda copy: null buffer for ", bytes, " bytes");
  const auto pd = reinterpret_cast<uintptr_t>(dst);
  const auto ps = reinterpret_cast<uintptr_t>(src);
  RR_CHECK(pd + bytes <= ps || ps + bytes <= pd, "ringreduce cuda copy: buffers overlap (", dst,
           " and ", src, ", ", bytes, " bytes)");
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
  RR_CHECK(err == cudaSuccess, "ringreduce cuda copy (", bytes,
           " bytes): cudaMemcpyAsync failed: ", cudaGetErrorString(err));
}

}  // namespace cuda
}  // namespace ringreduce

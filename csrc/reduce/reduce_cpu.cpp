// CPU reduction kernels.
//
// Every kernel is one template over an element "kind" (how an element is stored and in which type
// it is computed) and, for reduce(), an op functor. with_kind() and with_op() below are the only
// places that turn the runtime DType / RedOp tags into types; adding a dtype means adding a kind
// and one case there, never another copy of a loop.
//
// The loops are plain indexed loops over __restrict__ pointers so that GCC vectorises them at -O3.
// Restrict promises that no other pointer reaches the same elements, and reduce() allows dst to be
// a or b: rather than break the promise in place, that case gets its own loop in which the shared
// buffer is one pointer (reduce_into below). Only a == b, which nothing on the hot path does, runs
// a loop without restrict. fp16/bf16 go through fp32 blocks on the stack instead (reduce_staged).
//
// Never build this file with -ffast-math (or -ffinite-math-only): the NaN checks in min/max and the
// rounding tricks in reduce/half.h depend on IEEE semantics.

#include "reduce/reduce.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/error.h"
#include "common/small_array.h"
#include "reduce/half.h"
#include "reduce/kernels.h"
#include "reduce/kinds.h"
#include "reduce/ops.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define RR_X86_64 1
#else
#define RR_X86_64 0
#endif

// Function multiversioning: the library is built for baseline x86-64 (SSE2) so that one wheel runs
// everywhere, and the hot loops get a second, AVX2 copy chosen once at load time through an ifunc.
// This is GCC-only: Clang rejects target_clones on function templates, and ifuncs need glibc. Other
// builds get the baseline loop, which is still SSE2-vectorised.
// FMA is left out of the "avx2" clone on purpose, so both copies round identically and every rank
// gets the same bits whatever its CPU; CMake also passes -ffp-contract=off, in case the build's own
// flags enable FMA (-march=native), and so should any other build of this file.
// RINGREDUCE_BASELINE_ONLY builds only the baseline paths (no clones, no F16C), so that the tests
// can check them on a machine that would otherwise always pick the AVX2 ones. ThreadSanitizer
// builds have none either: an ifunc resolver runs before the sanitizer's runtime is set up, and
// its instrumented code crashes there.
#if RR_X86_64 && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(RINGREDUCE_BASELINE_ONLY) && !defined(__SANITIZE_THREAD__)
#define RR_CLONES __attribute__((target_clones("avx2", "default")))
#define RR_CLONES_ACTIVE 1
#else
#define RR_CLONES
#endif

// fp16 <-> fp32 with F16C instructions (one instruction per 8 elements, against ~8 per element for
// the portable conversion): chosen at run time, as target_clones cannot pick intrinsics.
#if RR_X86_64 && !defined(RINGREDUCE_BASELINE_ONLY)
#define RR_F16C 1
#define RR_TARGET_F16C __attribute__((target("avx2,f16c")))
#else
#define RR_F16C 0
#endif

namespace ringreduce {
namespace {

// ---------------------------------------------------------------------------------------------
// Element kinds

using namespace ops;  // the element traits and op functors (reduce/ops.h)

// A kind: Store is what lies in memory, Math what the op is computed in.
template <class T>
struct Native {
  using Store = T;
  using Math = T;
  static Math load(Store v) { return v; }
  static Store store(Math v) { return v; }
};

// fp16 and bf16 are not computed element by element: a block is widened to fp32 on the stack, the
// fp32 loop runs on it, and the result is rounded back once (see reduce_staged). So the op loops
// exist only for float, and the conversions can be whole-block F16C instructions. Both conversions
// are bit-exact with F16C (reduce/half.h), so which path runs never changes a result.

RR_CLONES void fp16_widen_portable(float* __restrict__ out, const uint16_t* __restrict__ in,
                                   size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
}
RR_CLONES void fp16_narrow_portable(uint16_t* __restrict__ out, const float* __restrict__ in,
                                    size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
}

#if RR_F16C
RR_TARGET_F16C void fp16_widen_f16c(float* __restrict__ out, const uint16_t* __restrict__ in,
                                    size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
}
RR_TARGET_F16C void fp16_narrow_f16c(uint16_t* __restrict__ out, const float* __restrict__ in,
                                     size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    // Rounding given in the instruction (to nearest even), not taken from MXCSR.
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = static_cast<uint16_t>(_cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT));
}

bool have_f16c() {
  // avx2 as well: the F16C path uses 256-bit registers, and GCC's avx2 check includes the OS
  // saving them.
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

RR_CLONES void bf16_widen(float* __restrict__ out, const uint16_t* __restrict__ in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}
RR_CLONES void bf16_narrow(uint16_t* __restrict__ out, const float* __restrict__ in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}

struct Half {
  using Store = uint16_t;
  using Math = float;
  static void widen(float* out, const uint16_t* in, size_t n) {
#if RR_F16C
    if (have_f16c()) return fp16_widen_f16c(out, in, n);
#endif
    fp16_widen_portable(out, in, n);
  }
  static void narrow(uint16_t* out, const float* in, size_t n) {
#if RR_F16C
    if (have_f16c()) return fp16_narrow_f16c(out, in, n);
#endif
    fp16_narrow_portable(out, in, n);
  }
};

struct BHalf {
  using Store = uint16_t;
  using Math = float;
  static void widen(float* out, const uint16_t* in, size_t n) { bf16_widen(out, in, n); }
  static void narrow(uint16_t* out, const float* in, size_t n) { bf16_narrow(out, in, n); }
};

template <class K>
constexpr bool kStaged = std::is_same_v<K, Half> || std::is_same_v<K, BHalf>;

// Stored as bytes, not C++ bool: loading a bool whose byte is neither 0 nor 1 is undefined, and a
// buffer that came through shared memory is just bytes. Any nonzero byte is true; results are 0/1.
struct Bool {
  using Store = uint8_t;
  using Math = bool;
  static Math load(Store v) { return v != 0; }
  static Store store(Math v) { return static_cast<Store>(v); }
};

// The host's floating-point primitives for ops.h's Sum and Prod: the plain operators (the build's
// -ffp-contract=off keeps each rounding), and the textbook complex formulas in the order that
// reduce_cuda.cu's device primitives follow.
struct HostArith {
  template <class M>
  static M add(M a, M b) { return a + b; }
  template <class M>
  static M mul(M a, M b) { return a * b; }
  template <class R>
  static Complex<R> add(Complex<R> x, Complex<R> y) { return {x.re + y.re, x.im + y.im}; }
  template <class R>
  static Complex<R> mul(Complex<R> x, Complex<R> y) {
    return {x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
  }
};

using Arith = HostArith;  // kinds.h's op list computes with it

// ---------------------------------------------------------------------------------------------
// Loops

template <class K, class Op>
RR_CLONES void reduce_distinct(typename K::Store* __restrict__ dst,
                               const typename K::Store* __restrict__ a,
                               const typename K::Store* __restrict__ b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = K::store(Op::apply(K::load(a[i]), K::load(b[i])));
}

// In place: acc is dst and one operand. AccIsLeft keeps the operand order of the call, which min
// and max need (for which NaN, or which signed zero, comes out).
template <class K, class Op, bool AccIsLeft>
RR_CLONES void reduce_into(typename K::Store* __restrict__ acc,
                           const typename K::Store* __restrict__ other, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto x = K::load(acc[i]);
    const auto y = K::load(other[i]);
    acc[i] = K::store(AccIsLeft ? Op::apply(x, y) : Op::apply(y, x));
  }
}

// a == b: no restrict, as dst may be that same buffer too.
template <class K, class Op>
void reduce_self(typename K::Store* dst, const typename K::Store* a, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const auto x = K::load(a[i]);
    dst[i] = K::store(Op::apply(x, x));
  }
}

// dst[i] = f(src[i]), for divide() and scale().
template <class K, class F>
RR_CLONES void map_distinct(typename K::Store* __restrict__ dst,
                            const typename K::Store* __restrict__ src, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) dst[i] = K::store(f(K::load(src[i])));
}

template <class K, class F>
RR_CLONES void map_inplace(typename K::Store* __restrict__ buf, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) buf[i] = K::store(f(K::load(buf[i])));
}

// The last reduce-scatter step of an all-reduce (reduce_and_copy): r = f(a[i] op b[i]), rounded to
// the stored type after the op and again after f, as reduce() then divide() would, and stored twice.
template <class K, class Op, class F>
RR_CLONES void reduce_map_twice(typename K::Store* __restrict__ dst, typename K::Store* __restrict__ out,
                                const typename K::Store* __restrict__ a,
                                const typename K::Store* __restrict__ b, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) {
    const auto r = K::store(f(K::load(K::store(Op::apply(K::load(a[i]), K::load(b[i]))))));
    dst[i] = r;
    out[i] = r;
  }
}

// The same with out == b (an in-place all-reduce): each element of b is read before it is written.
template <class K, class Op, class F>
RR_CLONES void reduce_map_twice_into(typename K::Store* __restrict__ dst,
                                     typename K::Store* __restrict__ acc,
                                     const typename K::Store* __restrict__ a, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) {
    const auto r = K::store(f(K::load(K::store(Op::apply(K::load(a[i]), K::load(acc[i]))))));
    dst[i] = r;
    acc[i] = r;
  }
}

struct Identity {
  template <class M>
  M operator()(M x) const { return x; }
};

// Elements per stage of the fp16/bf16 path: two fp32 blocks of 2 KiB stay in L1 beside the
// caller's data, and the per-block overhead (a few calls) is spread over 512 elements.
constexpr size_t kStageElems = 512;

// dst may be a or b: each block of a and b is read in full before that block of dst is written.
template <class K, class Op>
void reduce_staged(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n) {
  alignas(64) float x[kStageElems];
  alignas(64) float y[kStageElems];
  for (size_t i = 0; i < n; i += kStageElems) {
    const size_t m = std::min(kStageElems, n - i);
    K::widen(x, a + i, m);
    K::widen(y, b + i, m);
    reduce_into<Native<float>, Op, true>(x, y, m);
    K::narrow(dst + i, x, m);
  }
}

template <class K, class Op>
void run_reduce(void* dst, const void* a, const void* b, size_t n) {
  using S = typename K::Store;
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  if constexpr (kStaged<K>) {
    reduce_staged<K, Op>(d, x, y, n);
  } else {
    if (x == y) reduce_self<K, Op>(d, x, n);
    else if (d == x) reduce_into<K, Op, true>(d, y, n);
    else if (d == y) reduce_into<K, Op, false>(d, x, n);
    else reduce_distinct<K, Op>(d, x, y, n);
  }
}

template <class K, class F>
void map(void* dst, const void* src, size_t n, F f) {
  using S = typename K::Store;
  if constexpr (kStaged<K>) {
    alignas(64) float x[kStageElems];
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t m = std::min(kStageElems, n - i);
      K::widen(x, static_cast<const S*>(src) + i, m);
      map_inplace<Native<float>>(x, m, f);
      K::narrow(static_cast<S*>(dst) + i, x, m);
    }
  } else if (dst == src) {
    map_inplace<K>(static_cast<S*>(dst), n, f);
  } else {
    map_distinct<K>(static_cast<S*>(dst), static_cast<const S*>(src), n, f);
  }
}

template <class K, class Op, class F>
void run_reduce_and_copy(void* dst, void* out, const void* a, const void* b, size_t n, F f) {
  using S = typename K::Store;
  auto* d = static_cast<S*>(dst);
  auto* o = static_cast<S*>(out);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  if constexpr (kStaged<K>) {
    // Block by block, as reduce() and divide() would round them, while the block is in L1.
    alignas(64) float u[kStageElems];
    alignas(64) float v[kStageElems];
    for (size_t i = 0; i < n; i += kStageElems) {
      const size_t m = std::min(kStageElems, n - i);
      K::widen(u, x + i, m);
      K::widen(v, y + i, m);  // before o + i is written, which may be y + i
      reduce_into<Native<float>, Op, true>(u, v, m);
      K::narrow(d + i, u, m);
      if constexpr (!std::is_same_v<F, Identity>) {
        K::widen(u, d + i, m);
        map_inplace<Native<float>>(u, m, f);
        K::narrow(d + i, u, m);
      }
      std::memcpy(o + i, d + i, m * sizeof(S));
    }
  } else if (o == y) {
    reduce_map_twice_into<K, Op>(d, o, x, n, f);
  } else {
    reduce_map_twice<K, Op>(d, o, x, y, n, f);
  }
}

// reduce_many, one block of `len` elements at a time: acc = src[0] op src[1] op ..., in the Math
// type.
template <class K>
RR_CLONES void load_block(typename K::Math* __restrict__ acc, const typename K::Store* __restrict__ src,
                          size_t len) {
  for (size_t i = 0; i < len; ++i) acc[i] = K::load(src[i]);
}

template <class K, class Op>
RR_CLONES void accumulate_block(typename K::Math* __restrict__ acc,
                                const typename K::Store* __restrict__ src, size_t len) {
  for (size_t i = 0; i < len; ++i) acc[i] = Op::apply(acc[i], K::load(src[i]));
}

template <class K, class F>
RR_CLONES void store_block(typename K::Store* __restrict__ dst, const typename K::Math* __restrict__ acc,
                           size_t len, F f) {
  for (size_t i = 0; i < len; ++i) dst[i] = K::store(f(acc[i]));
}

template <class K, class Op, class F>
void run_reduce_many(void* dst, const void* const* src, int m, size_t n, F f) {
  using S = typename K::Store;
  using M = typename K::Math;
  auto* d = static_cast<S*>(dst);
  alignas(64) M acc[kStageElems];
  for (size_t i = 0; i < n; i += kStageElems) {
    const size_t len = std::min(kStageElems, n - i);
    if constexpr (kStaged<K>) {
      // Rounded to the stored type after every step, as the ring's partial sums are in its
      // slots: the same fold gives the ring's bits, whichever algorithm ran it.
      alignas(64) float tmp[kStageElems];
      alignas(64) S rounded[kStageElems];
      K::widen(acc, static_cast<const S*>(src[0]) + i, len);
      for (int k = 1; k < m; ++k) {
        K::widen(tmp, static_cast<const S*>(src[k]) + i, len);
        reduce_into<Native<float>, Op, true>(acc, tmp, len);
        K::narrow(rounded, acc, len);
        K::widen(acc, rounded, len);
      }
      if constexpr (!std::is_same_v<F, Identity>) map_inplace<Native<float>>(acc, len, f);
      K::narrow(d + i, acc, len);
    } else {
      load_block<K>(acc, static_cast<const S*>(src[0]) + i, len);
      for (int k = 1; k < m; ++k) accumulate_block<K, Op>(acc, static_cast<const S*>(src[k]) + i, len);
      store_block<K>(d + i, acc, len, f);
    }
  }
}

// Element maps. Floating kinds divide and scale in their Math type (fp32 for fp16/bf16).
template <class M>
struct DivideBy {
  M d;
  M operator()(M x) const { return x / d; }
};
template <class R>
struct DivideBy<Complex<R>> {
  R d;
  Complex<R> operator()(Complex<R> x) const { return {x.re / d, x.im / d}; }
};

// C++ integer division truncates toward zero, as torch's integer AVG and NCCL do. Every integer type
// fits in int64 and |x / d| <= |x|, so the quotient fits back, except x / -1 at the type's minimum,
// which has its own map.
template <class M>
struct IntDivideBy {
  int64_t d;
  M operator()(M x) const { return static_cast<M>(static_cast<int64_t>(x) / d); }
};
// Division by -1 as a wrapping negation: INT64_MIN / -1 traps on x86, and the narrower minimums
// wrap to themselves, which is what the hardware quotient truncated to the type would be.
template <class M>
struct IntNegate {
  M operator()(M x) const { return static_cast<M>(Wide<M>(0) - Wide<M>(x)); }
};

// Calls g with the map that divides kind K's elements by `divisor` (not bool's).
template <class K, class G>
void with_divider(int64_t divisor, G&& g) {
  using M = typename K::Math;
  if constexpr (kIsBool<M>) {
    // divide() and reduce_and_copy() reject bool before they get here.
  } else if constexpr (kIsInt<M>) {
    if (divisor == -1) g(IntNegate<M>{});
    else g(IntDivideBy<M>{divisor});
  } else if constexpr (IsComplex<M>::value) {
    using R = decltype(M::re);
    g(DivideBy<M>{static_cast<R>(divisor)});
  } else {
    g(DivideBy<M>{static_cast<M>(divisor)});
  }
}

template <class M>
struct ScaleBy {
  M f;
  M operator()(M x) const { return x * f; }
};
template <class R>
struct ScaleBy<Complex<R>> {
  R f;
  Complex<R> operator()(Complex<R> x) const { return {x.re * f, x.im * f}; }
};

// ---------------------------------------------------------------------------------------------
// The dispatch point: the tags to kinds and op functors as reduce/kinds.h lists them

template <class F>
void with_kind(DType t, const char* what, F&& f) {
  switch (t) {
    RINGREDUCE_DTYPES(RINGREDUCE_KIND_CASE)
  }
  throw Error(detail::cat("ringreduce ", what, ": unknown dtype tag ", static_cast<unsigned>(t)));
}

template <class F>
void with_op(RedOp op, F&& f) {
  switch (op) {
    RINGREDUCE_REDUCE_OPS(RINGREDUCE_OP_CASE)
  }
  throw Error(detail::cat("ringreduce reduce: unknown op tag ", static_cast<unsigned>(op)));
}

// Calls f(kind, op) with the kernel kind of t and the tag of op, which unsupported_reason() has
// accepted; a combination the kernels cannot compile (the two lists disagree) throws.
template <class F>
void with_kind_and_op(DType t, RedOp op, const char* what, F&& f) {
  with_kind(t, what, [&](auto kind) {
    using K = decltype(kind);
    with_op(op, [&](auto op_tag) {
      using Op = decltype(op_tag);
      if constexpr (supported<K, Op>()) {
        f(kind, op_tag);
      } else {
        throw Error(detail::cat("ringreduce ", what, ": internal error: no kernel for ",
                                redop_name(op), " on ", dtype_name(t)));
      }
    });
  });
}

// The kernels' restrict loops are only correct for exact aliasing or none; a partial overlap is a
// caller bug that would silently produce garbage, and the check costs two compares per call.
void check_no_partial_overlap(const char* what, const void* x, const void* y, size_t bytes,
                              DType t) {
  const auto px = reinterpret_cast<uintptr_t>(x);
  const auto py = reinterpret_cast<uintptr_t>(y);
  RR_CHECK(px == py || px + bytes <= py || py + bytes <= px, "ringreduce ", what, " (",
           dtype_name(t), "): output overlaps an input without being the same buffer (", x, " and ",
           y, ", ", bytes, " bytes)");
}

// For buffers that must not share a byte, not even by being the same buffer.
void check_disjoint(const char* what, const void* x, const void* y, size_t bytes, DType t) {
  const auto px = reinterpret_cast<uintptr_t>(x);
  const auto py = reinterpret_cast<uintptr_t>(y);
  RR_CHECK(px + bytes <= py || py + bytes <= px, "ringreduce ", what, " (", dtype_name(t),
           "): an output overlaps a buffer it must not share (", x, " and ", y, ", ", bytes,
           " bytes)");
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) {
  if (const char* why = unsupported_reason(t, op)) {
    throw Error(detail::cat("ringreduce reduce: ", redop_name(op), " is not supported on ",
                            dtype_name(t), ": ", why));
  }
  if (n == 0) return;
  RR_CHECK(dst && a && b, "ringreduce reduce (", redop_name(op), ", ", dtype_name(t),
           "): null buffer for ", n, " elements");
  const size_t bytes = n * dtype_size(t);
  check_no_partial_overlap("reduce", dst, a, bytes, t);
  check_no_partial_overlap("reduce", dst, b, bytes, t);

  with_kind_and_op(t, op, "reduce", [&](auto kind, auto op_tag) {
    run_reduce<decltype(kind), decltype(op_tag)>(dst, a, b, n);
  });
}

void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor) {
  RR_CHECK(t != DType::Bool, "ringreduce divide: bool tensors cannot be divided (an average of "
                             "bools is not a bool)");
  RR_CHECK(divisor != 0, "ringreduce divide (", dtype_name(t), "): divisor is zero");
  if (n == 0) return;
  RR_CHECK(dst && src, "ringreduce divide (", dtype_name(t), "): null buffer for ", n,
           " elements");
  check_no_partial_overlap("divide", dst, src, n * dtype_size(t), t);

  with_kind(t, "divide", [&](auto kind) {
    using K = decltype(kind);
    with_divider<K>(divisor, [&](auto f) { map<K>(dst, src, n, f); });
  });
}

void reduce_and_copy(void* dst, void* out, const void* a, const void* b, size_t n, DType t,
                     RedOp op, int64_t divisor) {
  if (const char* why = unsupported_reason(t, op)) {
    throw Error(detail::cat("ringreduce reduce_and_copy: ", redop_name(op), " is not supported on ",
                            dtype_name(t), ": ", why));
  }
  RR_CHECK(divisor == 1 || t != DType::Bool, "ringreduce reduce_and_copy: bool tensors cannot be "
                                             "divided (an average of bools is not a bool)");
  RR_CHECK(divisor != 0, "ringreduce reduce_and_copy (", dtype_name(t), "): divisor is zero");
  if (n == 0) return;
  RR_CHECK(dst && out && a && b, "ringreduce reduce_and_copy (", redop_name(op), ", ",
           dtype_name(t), "): null buffer for ", n, " elements");
  const size_t bytes = n * dtype_size(t);
  check_disjoint("reduce_and_copy", dst, a, bytes, t);
  check_disjoint("reduce_and_copy", dst, b, bytes, t);
  check_disjoint("reduce_and_copy", dst, out, bytes, t);
  check_disjoint("reduce_and_copy", out, a, bytes, t);
  check_no_partial_overlap("reduce_and_copy", out, b, bytes, t);

  with_kind_and_op(t, op, "reduce_and_copy", [&](auto kind, auto op_tag) {
    using K = decltype(kind);
    using Op = decltype(op_tag);
    if (divisor == 1) {
      run_reduce_and_copy<K, Op>(dst, out, a, b, n, Identity{});
    } else {
      with_divider<K>(divisor, [&](auto f) { run_reduce_and_copy<K, Op>(dst, out, a, b, n, f); });
    }
  });
}

namespace {

// reduce_many's and reduce_rotated's checks: whether there is anything to do.
bool check_many(const char* what, void* dst, const void* const* src, int m, size_t n, DType t,
                RedOp op, int64_t divisor) {
  if (const char* why = unsupported_reason(t, op)) {
    throw Error(detail::cat("ringreduce ", what, ": ", redop_name(op), " is not supported on ",
                            dtype_name(t), ": ", why));
  }
  RR_CHECK(m >= 1, "ringreduce ", what, ": ", m, " sources");
  RR_CHECK(divisor == 1 || t != DType::Bool, "ringreduce ", what, ": bool tensors cannot be "
                                             "divided (an average of bools is not a bool)");
  RR_CHECK(divisor != 0, "ringreduce ", what, " (", dtype_name(t), "): divisor is zero");
  if (n == 0) return false;
  const size_t bytes = n * dtype_size(t);
  RR_CHECK(dst != nullptr, "ringreduce ", what, ": null output for ", n, " elements");
  for (int k = 0; k < m; ++k) {
    RR_CHECK(src[k] != nullptr, "ringreduce ", what, ": source ", k, " is null");
    check_no_partial_overlap(what, dst, src[k], bytes, t);
  }
  return true;
}

// reduce_many's fold of n elements at element `at` of dst and of every source, for kind K and op
// Op, the sources in the order given.
template <class K, class Op>
void fold_many(void* dst, const void* const* src, int m, size_t at, size_t n, int64_t divisor) {
  using S = typename K::Store;
  auto at_ = [at](const void* p) { return static_cast<const S*>(p) + at; };
  S* d = static_cast<S*>(dst) + at;
  if (divisor == 1 && m == 2) {
    // One pass, dst = src[0] op src[1], with the same rounding as the staged fold: two ranks'
    // one-shot and two-shot reductions, which read one source from another core's cache.
    run_reduce<K, Op>(d, at_(src[0]), at_(src[1]), n);
    return;
  }
  // The sources at `at`.
  SmallArray<const void*> moved(at == 0 ? 0 : static_cast<size_t>(m));
  const void* const* s = src;
  if (at != 0) {
    for (int k = 0; k < m; ++k) moved[k] = at_(src[k]);
    s = moved.data();
  }
  if (divisor == 1) {
    run_reduce_many<K, Op>(d, s, m, n, Identity{});
  } else {
    with_divider<K>(divisor, [&](auto f) { run_reduce_many<K, Op>(d, s, m, n, f); });
  }
}

}  // namespace

void reduce_many(void* dst, const void* const* src, int m, size_t n, DType t, RedOp op,
                 int64_t divisor) {
  if (!check_many("reduce_many", dst, src, m, n, t, op, divisor)) return;
  with_kind_and_op(t, op, "reduce_many", [&](auto kind, auto op_tag) {
    fold_many<decltype(kind), decltype(op_tag)>(dst, src, m, 0, n, divisor);
  });
}

void reduce_rotated(void* dst, const void* const* src, int m, size_t n, size_t chunk, DType t,
                    RedOp op, int64_t divisor) {
  RR_CHECK(chunk > 0, "ringreduce reduce_rotated: chunks of 0 elements");
  if (!check_many("reduce_rotated", dst, src, m, n, t, op, divisor)) return;
  SmallArray<const void*> order(static_cast<size_t>(m));
  with_kind_and_op(t, op, "reduce_rotated", [&](auto kind, auto op_tag) {
    // Chunk c's fold starts at source (c + 1) % m: counted along, without a division per source.
    int first = m == 1 ? 0 : 1;
    for (size_t lo = 0; lo < n; lo += std::min(chunk, n - lo)) {
      for (int k = 0, i = first; k < m; ++k, i = i + 1 == m ? 0 : i + 1) order[k] = src[i];
      first = first + 1 == m ? 0 : first + 1;
      fold_many<decltype(kind), decltype(op_tag)>(dst, order.data(), m, lo, std::min(chunk, n - lo), divisor);
    }
  });
}

void scale(void* dst, const void* src, size_t n, DType t, double factor) {
  RR_CHECK(!is_integral(t), "ringreduce scale: ", dtype_name(t),
           " is not a floating or complex type (premul_sum needs one)");
  if (n == 0) return;
  RR_CHECK(dst && src, "ringreduce scale (", dtype_name(t), "): null buffer for ", n,
           " elements");
  check_no_partial_overlap("scale", dst, src, n * dtype_size(t), t);

  with_kind(t, "scale", [&](auto kind) {
    using K = decltype(kind);
    using M = typename K::Math;
    // The factor is rounded to the Math type first, as torch does when it multiplies a float
    // tensor by a Python float.
    if constexpr (IsComplex<M>::value) {
      using R = decltype(M::re);
      map<K>(dst, src, n, ScaleBy<M>{static_cast<R>(factor)});
    } else if constexpr (kIsFloat<M>) {
      map<K>(dst, src, n, ScaleBy<M>{static_cast<M>(factor)});
    }
  });
}

// ---------------------------------------------------------------------------------------------
// copy

namespace {

// Whether to stream is the caller's decision: the ring asks for it when the whole op is too large
// to stay in cache, and then calls copy() once per slice, each well under the op's size.
// Non-temporal stores skip the read-for-ownership of every destination line (a third of the memory
// traffic of a copy) and leave the cache to the ring's own buffers. Below this size the aligned
// head and tail handled by memcpy dominate, so tiny copies stay plain.
constexpr size_t kStreamingMinBytes = 4 * 1024;

#if RR_X86_64
// SSE2 is baseline on x86-64, so no dispatch: 16-byte non-temporal stores reach the same bandwidth
// as 32-byte ones, as both fill whole write-combining buffers.
void stream_copy(char* dst, const char* src, size_t bytes) {
  // Non-temporal stores need an aligned destination; aligning to a whole line also means each
  // iteration's four stores fill one write-combining buffer, which is then flushed as a full line
  // rather than as partial writes. The source may stay unaligned: loadu costs the same.
  const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t(63);
  for (size_t i = 0; i < body; i += 64) {
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i v3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), v0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), v1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), v2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), v3);
  }
  std::memcpy(dst + body, src + body, bytes - body);
  // Non-temporal stores are weakly ordered: without the fence, a flag the caller stores next (a
  // "done" mark in shared memory, say) could become visible before the data.
  _mm_sfence();
}
#endif

}  // namespace

void copy(void* dst, const void* src, size_t bytes, bool streaming) {
  // memcpy with dst == src, or with null pointers even for 0 bytes, is undefined.
  if (bytes == 0 || dst == src) return;
  RR_CHECK(dst && src, "ringreduce copy: null buffer for ", bytes, " bytes");
  const auto pd = reinterpret_cast<uintptr_t>(dst);
  const auto ps = reinterpret_cast<uintptr_t>(src);
  RR_CHECK(pd + bytes <= ps || ps + bytes <= pd, "ringreduce copy: buffers overlap (", dst, " and ",
           src, ", ", bytes, " bytes)");
#if RR_X86_64
  if (streaming && bytes >= kStreamingMinBytes) {
    stream_copy(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
    return;
  }
#else
  (void)streaming;
#endif
  std::memcpy(dst, src, bytes);
}

void reduce_streamed(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) {
#if RR_X86_64
  // Each block is reduced into L1 and streamed out from there: one kernel per dtype and op, not a
  // second, non-temporal copy of every loop. The block is small enough to stay in L1 beside the
  // operands' lines and large enough that the calls cost nothing beside its bytes.
  constexpr size_t kBlockBytes = 8 * 1024;
  const size_t es = dtype_size(t);
  if (n * es < kStreamingMinBytes) {
    reduce(dst, a, b, n, t, op);
    return;
  }
  RR_CHECK(dst && a && b, "ringreduce reduce_streamed (", redop_name(op), ", ", dtype_name(t),
           "): null buffer for ", n, " elements");
  check_no_partial_overlap("reduce_streamed", dst, a, n * es, t);
  check_no_partial_overlap("reduce_streamed", dst, b, n * es, t);
  alignas(64) unsigned char block[kBlockBytes];
  const size_t per_block = kBlockBytes / es;
  auto* d = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  for (size_t i = 0; i < n; i += per_block) {
    const size_t m = std::min(per_block, n - i);
    // Block i of a and b is read in full before block i of dst is written: dst may be a or b.
    reduce(block, x + i * es, y + i * es, m, t, op);
    copy(d + i * es, block, m * es, true);  // a short last block goes plain
  }
#else
  reduce(dst, a, b, n, t, op);
#endif
}

}  // namespace ringreduce

namespace ringreduce {

namespace {

class CpuKernels final : public Kernels {
 public:
  void reduce(void* dst, const void* a, const void* b, size_t n, DType t, RedOp op) override {
    ringreduce::reduce(dst, a, b, n, t, op);
  }
  void divide(void* dst, const void* src, size_t n, DType t, int64_t divisor) override {
    ringreduce::divide(dst, src, n, t, divisor);
  }
  void copy(void* dst, const void* src, size_t bytes, bool streaming) override {
    ringreduce::copy(dst, src, bytes, streaming);
  }
  void reduce_and_copy(void* dst, void* out, const void* a, const void* b, size_t n, DType t,
                       RedOp op, int64_t divisor) override {
    ringreduce::reduce_and_copy(dst, out, a, b, n, t, op, divisor);
  }
  void reduce_streamed(void* dst, const void* a, const void* b, size_t n, DType t,
                       RedOp op) override {
    ringreduce::reduce_streamed(dst, a, b, n, t, op);
  }
  // The result is made in `out` (plain stores: the caller reads it soon) and streamed from there
  // into `dst`, while it is still in cache: the same bits as the fused pass, in reduce_and_copy's
  // own three steps.
  void reduce_and_copy_streamed(void* dst, void* out, const void* a, const void* b, size_t n,
                                DType t, RedOp op, int64_t divisor) override {
    if (n == 0) return;
    const size_t bytes = n * dtype_size(t);
    const auto pd = reinterpret_cast<uintptr_t>(dst);
    const auto po = reinterpret_cast<uintptr_t>(out);
    const auto pa = reinterpret_cast<uintptr_t>(a);
    RR_CHECK(dst && out && (pd + bytes <= po || po + bytes <= pd) &&
                 (po + bytes <= pa || pa + bytes <= po),
             "ringreduce reduce_and_copy_streamed (", dtype_name(t),
             "): the slot, the output and the received partial must not overlap");
    ringreduce::reduce(out, a, b, n, t, op);
    if (divisor != 1) ringreduce::divide(out, out, n, t, divisor);
    ringreduce::copy(dst, out, bytes, true);
  }
};

}  // namespace

Kernels& cpu_kernels() {
  static CpuKernels k;  // stateless: shared by every ring of the process
  return k;
}

const char* simd_level() {
#if defined(__GNUC__) && !defined(__clang__) && RR_X86_64
  const bool avx2 = __builtin_cpu_supports("avx2");
#else
  const bool avx2 = false;
#endif
#if RR_F16C
  const bool f16c = have_f16c();
#else
  const bool f16c = false;
#endif
#ifdef RR_CLONES_ACTIVE
  const bool clones = true;
#else
  const bool clones = false;
#endif
  if (clones && avx2) return f16c ? "avx2, f16c" : "avx2";
  return f16c ? "baseline (sse2), f16c" : "baseline (sse2)";
}

}  // namespace ringreduce

// What a reduction op does to two elements, written once for the CPU kernels (reduce_cpu.cpp) and
// the CUDA kernels (reduce_cuda.cu): the element traits, the wrapping of integer sums and
// products, bool's ops, the NaN rules of min and max, and which dtype and op pairs exist at all.
// The two files differ only in the floating-point primitives they hand in as `Arith` (plain
// operators on the host; on the device, intrinsics that round and give NaNs as x86 does), so
// every rank computes the same bits wherever its slices are reduced.
#pragma once

#include <type_traits>

// In a CUDA file the ops run in kernels only, on the device's primitives.
#ifdef __CUDACC__
#define RR_OP_FN __device__ __forceinline__
#else
#define RR_OP_FN inline
#endif

namespace ringreduce::ops {

// Two packed reals, the layout of std::complex<R>, c10::complex<R> and C's _Complex. Aligned as
// one real, not two: a complex128 slice may start 8 bytes past a 16-byte boundary. Its arithmetic
// is the Arith's (the textbook formulas: std::complex's operator* goes through __mulsc3, NaN/Inf
// recovery that is never vectorised, and torch multiplies c10::complex the textbook way).
template <class R>
struct Complex {
  R re, im;
};
static_assert(sizeof(Complex<float>) == 8 && sizeof(Complex<double>) == 16,
              "complex must be two packed reals");

template <class T>
struct IsComplex : std::false_type {};
template <class R>
struct IsComplex<Complex<R>> : std::true_type {};

template <class M>
constexpr bool kIsFloat = std::is_floating_point_v<M>;
template <class M>
constexpr bool kIsBool = std::is_same_v<M, bool>;
template <class M>
constexpr bool kIsInt = std::is_integral_v<M> && !kIsBool<M>;

// Signed overflow is undefined, and uint8/uint16 promote to (signed) int, so integer sums and
// products are done in an unsigned type at least as wide as unsigned int and wrapped back, which is
// what torch and NCCL produce.
template <class M>
using Wide = std::conditional_t<(sizeof(M) < sizeof(unsigned)), unsigned, std::make_unsigned_t<M>>;

template <class Arith>
struct Sum {
  template <class M>
  RR_OP_FN static M apply(M a, M b) {
    if constexpr (kIsBool<M>) return a | b;
    else if constexpr (kIsInt<M>) return static_cast<M>(Wide<M>(a) + Wide<M>(b));
    else return Arith::add(a, b);
  }
};

template <class Arith>
struct Prod {
  template <class M>
  RR_OP_FN static M apply(M a, M b) {
    if constexpr (kIsBool<M>) return a & b;
    else if constexpr (kIsInt<M>) return static_cast<M>(Wide<M>(a) * Wide<M>(b));
    else return Arith::mul(a, b);
  }
};

// torch's min/max propagate NaN: if either operand is NaN the result is NaN, an input's bit for
// bit, and which one is fixed by the operand order written here. Selects, no arithmetic, written
// with `|` rather than `||` so there is no branch to stop if-conversion.
struct Min {
  template <class M>
  RR_OP_FN static M apply(M a, M b) {
    if constexpr (kIsBool<M>) return a & b;
    else if constexpr (kIsFloat<M>) return ((a < b) | (a != a)) ? a : b;
    else return a < b ? a : b;
  }
};

struct Max {
  template <class M>
  RR_OP_FN static M apply(M a, M b) {
    if constexpr (kIsBool<M>) return a | b;
    else if constexpr (kIsFloat<M>) return ((a > b) | (a != a)) ? a : b;
    else return a > b ? a : b;
  }
};

struct BAnd {
  template <class M>
  RR_OP_FN static M apply(M a, M b) { return static_cast<M>(a & b); }
};
struct BOr {
  template <class M>
  RR_OP_FN static M apply(M a, M b) { return static_cast<M>(a | b); }
};
struct BXor {
  template <class M>
  RR_OP_FN static M apply(M a, M b) { return static_cast<M>(a ^ b); }
};

// The compile-time mirror of unsupported_reason() (reduce.h): a kind K (its Math type) and an op
// that it rejects are never instantiated (they would not compile: there is no `<` on complex, no
// `&` on float).
template <class K, class Op>
constexpr bool supported() {
  using M = typename K::Math;
  if constexpr (std::is_same_v<Op, Min> || std::is_same_v<Op, Max>) return !IsComplex<M>::value;
  if constexpr (std::is_same_v<Op, BAnd> || std::is_same_v<Op, BOr> || std::is_same_v<Op, BXor>) {
    return kIsInt<M> || kIsBool<M>;
  }
  return true;
}

}  // namespace ringreduce::ops

// The references the kernel tests (test_reduce.cpp) compare against: binary floating-point
// formats decoded and rounded from their definition, elements of any dtype read from raw bytes,
// random inputs with every kind of special value, guarded buffers, and the reference reduce of
// one element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "reduce/half.h"
#include "reduce/kernels.h"
#include "reduce/reduce.h"
#include "aliasing.h"
#include "rrtest.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TEST_HAVE_F16C_CODE 1
#endif

using namespace ringreduce;

namespace {

// Around the vector widths (16 = one AVX2 register of fp16), a prime, and a large odd count.
const size_t kCounts[] = {0, 1, 7, 15, 16, 17, 1009, 65536 + 3};

using Rng = std::mt19937_64;

// ---------------------------------------------------------------------------------------------
// Reference binary floating-point formats, from the definition.

struct Fmt {
  int mbits;  // stored mantissa bits
  int ebits;
};
constexpr Fmt kF16{10, 5};
constexpr Fmt kBF16{7, 8};
constexpr Fmt kF32{23, 8};

int bias(Fmt f) { return (1 << (f.ebits - 1)) - 1; }

double ref_decode(uint64_t bits, Fmt f) {
  const uint64_t m = bits & ((uint64_t(1) << f.mbits) - 1);
  const uint64_t e = (bits >> f.mbits) & ((uint64_t(1) << f.ebits) - 1);
  const bool neg = (bits >> (f.mbits + f.ebits)) & 1;
  double v;
  if (e == 0) {
    v = std::ldexp(double(m), 1 - bias(f) - f.mbits);
  } else if (e == (uint64_t(1) << f.ebits) - 1) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(double((uint64_t(1) << f.mbits) + m), int(e) - bias(f) - f.mbits);
  }
  return neg ? -v : v;
}

// x rounded to the nearest value of f, ties to even, overflowing to infinity.
double ref_round(double x, Fmt f) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  const int emin = 1 - bias(f);
  const int emax = bias(f);
  int e2;
  std::frexp(x, &e2);
  const int e = std::max(e2 - 1, emin);  // below emin the ulp stays that of the subnormals
  const double units = std::nearbyint(std::ldexp(x, f.mbits - e));  // x in ulps, rounded
  const double r = std::ldexp(units, e - f.mbits);
  const double max_finite = std::ldexp(double((uint64_t(2) << f.mbits) - 1), emax - f.mbits);
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r == 0 ? std::copysign(0.0, x) : r;
}

// Bits of r, which must be a value of f (or +-0, +-inf).
uint64_t ref_encode(double r, Fmt f) {
  const uint64_t sign = uint64_t(std::signbit(r)) << (f.mbits + f.ebits);
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | (((uint64_t(1) << f.ebits) - 1) << f.mbits);
  if (a == 0) return sign;
  int e2;
  std::frexp(a, &e2);
  const int e = e2 - 1;
  const int emin = 1 - bias(f);
  if (e < emin) return sign | uint64_t(std::ldexp(a, f.mbits - emin));
  const uint64_t m = uint64_t(std::ldexp(a, f.mbits - e)) - (uint64_t(1) << f.mbits);
  return sign | (uint64_t(e + bias(f)) << f.mbits) | m;
}

uint32_t fbits(float f) { return rrtest::bit_cast<uint32_t>(f); }
float ffrom(uint32_t u) { return rrtest::bit_cast<float>(u); }

#ifdef TEST_HAVE_F16C_CODE
__attribute__((target("f16c"))) uint16_t hw_float_to_fp16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_fp16_to_float(uint16_t h) { return _cvtsh_ss(h); }
bool have_f16c() { return __builtin_cpu_supports("f16c"); }
#else
uint16_t hw_float_to_fp16(float) { return 0; }
float hw_fp16_to_float(uint16_t) { return 0; }
bool have_f16c() { return false; }
#endif

// ---------------------------------------------------------------------------------------------
// Elements of any dtype, read from raw bytes.

enum class Cat { Float, Int, Bool, Complex };

Cat category(DType t) {
  if (is_complex(t)) return Cat::Complex;
  if (t == DType::Bool) return Cat::Bool;
  if (is_integral(t)) return Cat::Int;
  return Cat::Float;
}

template <class T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <class T>
void put(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}

double float_value(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::Float32: return load<float>(p, i);
    case DType::Float64: return load<double>(p, i);
    case DType::Float16: return ref_decode(load<uint16_t>(p, i), kF16);
    case DType::BFloat16: return ref_decode(load<uint16_t>(p, i), kBF16);
    default: throw Error("float_value: not a float type");
  }
}

// The exact result x of an op, as the kernels must round it. fp16/bf16 are computed in fp32 and
// rounded once more, which is what torch does too; for + - * that equals rounding x straight to
// the type, but for a quotient or a scaled value that lands in fp32's subnormal range (reachable
// from bf16) the two can differ, so the reference follows the specification literally.
double round_to(DType t, double x) {
  switch (t) {
    case DType::Float32: return ref_round(x, kF32);
    case DType::Float64: return x;
    case DType::Float16: return ref_round(ref_round(x, kF32), kF16);
    case DType::BFloat16: return ref_round(ref_round(x, kF32), kBF16);
    case DType::Complex64: return ref_round(x, kF32);
    case DType::Complex128: return x;
    default: throw Error("round_to: not a float type");
  }
}

int64_t int_value(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::Int8: return load<int8_t>(p, i);
    case DType::UInt8: return load<uint8_t>(p, i);
    case DType::Int16: return load<int16_t>(p, i);
    case DType::Int32: return load<int32_t>(p, i);
    case DType::Int64: return load<int64_t>(p, i);
    default: throw Error("int_value: not an int type");
  }
}

// v reduced modulo 2^bits of t, as the type would hold it.
int64_t wrap(DType t, uint64_t v) {
  switch (t) {
    case DType::Int8: return static_cast<int8_t>(static_cast<uint8_t>(v));
    case DType::UInt8: return static_cast<uint8_t>(v);
    case DType::Int16: return static_cast<int16_t>(static_cast<uint16_t>(v));
    case DType::Int32: return static_cast<int32_t>(static_cast<uint32_t>(v));
    case DType::Int64: return static_cast<int64_t>(v);
    default: throw Error("wrap: not an int type");
  }
}

struct Cx {
  double re, im;
};
Cx complex_value(DType t, const void* p, size_t i) {
  if (t == DType::Complex64) return {load<float>(p, 2 * i), load<float>(p, 2 * i + 1)};
  return {load<double>(p, 2 * i), load<double>(p, 2 * i + 1)};
}

std::string hex_bytes(DType t, const void* p, size_t i) {
  const size_t es = dtype_size(t);
  const auto* b = static_cast<const unsigned char*>(p) + i * es;
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = es; k-- > 0;) {  // little-endian: most significant byte last
    s += digits[b[k] >> 4];
    s += digits[b[k] & 15];
  }
  return s;
}

// Equal as values, NaN matching NaN; the sign of a zero counts unless zero_sign_free.
bool same_value(double got, double want, bool zero_sign_free = false) {
  if (std::isnan(want)) return std::isnan(got);
  if (got != want) return false;
  if (got == 0 && !zero_sign_free) return std::signbit(got) == std::signbit(want);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Random inputs

void fill_random(DType t, void* p, size_t n, Rng& g) {
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_int_distribution<int> exp(-20, 20);
  const double specials[] = {0.0,
                             -0.0,
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN(),
                             1.0,
                             -1.0};
  switch (category(t)) {
    case Cat::Float:
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = g();
        if (t == DType::Float16 || t == DType::BFloat16) {
          put<uint16_t>(p, i, static_cast<uint16_t>(r));  // every bit pattern, NaNs included
          continue;
        }
        const int kind = static_cast<int>(r % 8);
        double v;
        if (kind == 0) {
          // any bit pattern: huge, tiny, subnormal, NaN with payload
          if (t == DType::Float32) v = ffrom(static_cast<uint32_t>(r >> 32));
          else {
            const uint64_t b = g();
            std::memcpy(&v, &b, 8);
          }
        } else if (kind == 1) {
          v = specials[(r >> 8) % (sizeof specials / sizeof specials[0])];
        } else {
          v = std::ldexp(unit(g), exp(g));
        }
        if (t == DType::Float32) put<float>(p, i, static_cast<float>(v));
        else put<double>(p, i, v);
      }
      break;
    case Cat::Int: {
      auto* b = static_cast<unsigned char*>(p);
      for (size_t i = 0; i < n * dtype_size(t); ++i) b[i] = static_cast<unsigned char>(g());
      break;
    }
    case Cat::Bool: {
      auto* b = static_cast<unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = g();
        // Mostly 0/1 as torch writes them, some other nonzero bytes to check they count as true.
        b[i] = (r % 4 == 0) ? static_cast<unsigned char>(r >> 8) : static_cast<unsigned char>(r & 1);
      }
      break;
    }
    case Cat::Complex:
      for (size_t i = 0; i < 2 * n; ++i) {
        const double v = std::ldexp(unit(g), exp(g) / 4);
        if (t == DType::Complex64) put<float>(p, i, static_cast<float>(v));
        else put<double>(p, i, v);
      }
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// A buffer with a misaligned start and guard bytes on both sides, to catch writes past the ends
// that land inside the allocation (where ASan would not see them).

class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kPattern = 0xA5;

  GuardedBuffer(size_t bytes, size_t misalign) : mem_(bytes + misalign + 3 * kGuard), bytes_(bytes) {
    auto base = reinterpret_cast<uintptr_t>(mem_.data()) + kGuard;
    base = (base + 63) & ~uintptr_t(63);
    data_ = reinterpret_cast<unsigned char*>(base) + misalign;
    std::fill(mem_.begin(), mem_.end(), kPattern);
  }
  unsigned char* data() { return data_; }
  bool guards_intact() const {
    const unsigned char* begin = mem_.data();
    const unsigned char* end = mem_.data() + mem_.size();
    for (const unsigned char* q = begin; q < data_; ++q)
      if (*q != kPattern) return false;
    for (const unsigned char* q = data_ + bytes_; q < end; ++q)
      if (*q != kPattern) return false;
    return true;
  }

 private:
  std::vector<unsigned char> mem_;
  size_t bytes_;
  unsigned char* data_;
};

// ---------------------------------------------------------------------------------------------
// Reference reduce, one element: "" if got is right, else what was wanted.

std::string check_reduce_elem(DType t, RedOp op, const void* a, const void* b, const void* got,
                              size_t i) {
  switch (category(t)) {
    case Cat::Float: {
      const double x = float_value(t, a, i), y = float_value(t, b, i);
      double want = 0;
      switch (op) {
        case RedOp::Sum: want = x + y; break;
        case RedOp::Prod: want = x * y; break;
        case RedOp::Min:
          want = (std::isnan(x) || std::isnan(y)) ? std::numeric_limits<double>::quiet_NaN()
                                                  : std::min(x, y);
          break;
        case RedOp::Max:
          want = (std::isnan(x) || std::isnan(y)) ? std::numeric_limits<double>::quiet_NaN()
                                                  : std::max(x, y);
          break;
        default: return "op not defined on floats";
      }
      want = round_to(t, want);
      const double g = float_value(t, got, i);
      // Which zero min/max return for (+0, -0) is not specified by torch either.
      const bool zero_free = op == RedOp::Min || op == RedOp::Max;
      if (same_value(g, want, zero_free)) return "";
      return rrtest::message("want ", want, ", got ", g);
    }
    case Cat::Int: {
      const int64_t x = int_value(t, a, i), y = int_value(t, b, i);
      const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
      int64_t want = 0;
      switch (op) {
        case RedOp::Sum: want = wrap(t, ux + uy); break;
        case RedOp::Prod: want = wrap(t, ux * uy); break;
        case RedOp::Min: want = std::min(x, y); break;
        case RedOp::Max: want = std::max(x, y); break;
        case RedOp::BAnd: want = wrap(t, ux & uy); break;
        case RedOp::BOr: want = wrap(t, ux | uy); break;
        case RedOp::BXor: want = wrap(t, ux ^ uy); break;
      }
      const int64_t g = int_value(t, got, i);
      if (g == want) return "";
      return rrtest::message("want ", want, ", got ", g);
    }
    case Cat::Bool: {
      const bool x = load<uint8_t>(a, i) != 0, y = load<uint8_t>(b, i) != 0;
      bool want = false;
      switch (op) {
        case RedOp::Sum: case RedOp::Max: case RedOp::BOr: want = x || y; break;
        case RedOp::Prod: case RedOp::Min: case RedOp::BAnd: want = x && y; break;
        case RedOp::BXor: want = x != y; break;
      }
      const unsigned g = load<uint8_t>(got, i);
      if (g == (want ? 1u : 0u)) return "";
      return rrtest::message("want byte ", int(want), ", got ", g);
    }
    case Cat::Complex: {
      const Cx x = complex_value(t, a, i), y = complex_value(t, b, i);
      const Cx g = complex_value(t, got, i);
      if (op == RedOp::Sum) {
        const Cx want{round_to(t, x.re + y.re), round_to(t, x.im + y.im)};
        if (same_value(g.re, want.re) && same_value(g.im, want.im)) return "";
        return rrtest::message("want (", want.re, ", ", want.im, "), got (", g.re, ", ", g.im, ")");
      }
      // Prod: the kernel rounds each of the four products and the two sums, so compare within a
      // few ulps of the magnitudes involved, against a wider computation.
      using LD = long double;
      const LD rr = LD(x.re) * y.re, ii = LD(x.im) * y.im, ri = LD(x.re) * y.im, ir = LD(x.im) * y.re;
      const LD want_re = rr - ii, want_im = ri + ir;
      const double eps = t == DType::Complex64 ? 0x1p-24 : 0x1p-53;
      const LD tol_re = 4 * eps * (std::fabs(rr) + std::fabs(ii)) + 1e-300L;
      const LD tol_im = 4 * eps * (std::fabs(ri) + std::fabs(ir)) + 1e-300L;
      if (std::fabs(LD(g.re) - want_re) <= tol_re && std::fabs(LD(g.im) - want_im) <= tol_im) return "";
      return rrtest::message("want (", double(want_re), ", ", double(want_im), "), got (", g.re,
                             ", ", g.im, ")");
    }
  }
  return "unknown category";
}

bool supported(DType t, RedOp op) {
  if (is_complex(t)) return op == RedOp::Sum || op == RedOp::Prod;
  if (is_floating(t)) return op == RedOp::Sum || op == RedOp::Prod || op == RedOp::Min || op == RedOp::Max;
  return true;
}

#define EXPECT_ERROR_NAMING(expr, ...) RR_EXPECT_THROW_NAMING(Error, expr, __VA_ARGS__)

using rrtest::Alias;
using rrtest::alias_name;

}  // namespace

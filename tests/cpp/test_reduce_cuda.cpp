// Tests of the CUDA kernels (csrc/reduce/reduce_cuda.cu) against the CPU kernels, byte for byte.
//
// The CPU kernels are tested against references of their own (test_reduce.cpp); here the only
// question is whether a GPU rank and a CPU rank given the same inputs write the same bytes, over
// every dtype and op, counts on both sides of the 16-byte body, pointers at the same and at
// different offsets modulo 16 (the vector and the scalar paths) and the in-place forms.
//
// One thing is left out of the byte-for-byte sweep on purpose: an IEEE op whose two operands are
// both NaN. x86 returns the first operand's NaN, and which operand is "first" is up to the CPU
// compiler (it commutes a + b as it likes, and does so differently in the CPU's in-place and
// out-of-place loops), so the CPU has no single answer to match. The inputs are drawn so that no
// op of the CPU's formulas sees two NaNs (at most one NaN per element pair; for complex, at most
// one non-finite component among the four, so no intermediate NaN meets another either), and
// both_operands_nan below checks what the GPU does in that case instead.
//
// Exits 77 (ctest: skipped) when there is no CUDA device.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "reduce/reduce.h"
#include "reduce/reduce_cuda.h"
#include "aliasing.h"
#include "rrtest.h"

using namespace ringreduce;

namespace {

// Empty, one element (head only), less than one 16-byte vector, a prime-ish count past a
// whole number of vectors, and a large odd one that runs several grid-stride iterations.
const size_t kCounts[] = {0, 1, 7, 4097, (size_t(1) << 20) + 3};
constexpr size_t kBig = (size_t(1) << 20) + 3;

using Rng = std::mt19937_64;

#define CUDA_REQUIRE(expr)                                                               \
  do {                                                                                   \
    const cudaError_t rr_err_ = (expr);                                                  \
    RR_REQUIRE(rr_err_ == cudaSuccess, #expr, ": ", cudaGetErrorString(rr_err_));       \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Buffers

// Device memory with kGuard bytes of a known pattern before and after the region in use, so
// that a head or tail written one element too far shows up. cudaMalloc aligns to 256 bytes, so
// at(off) is off bytes past a 16-byte boundary.
class DeviceBuffer {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kPattern = 0xA5;

  explicit DeviceBuffer(size_t capacity) : size_(capacity + 2 * kGuard) {
    const cudaError_t err = cudaMalloc(&base_, size_);
    if (err != cudaSuccess) {
      throw Error(detail::cat("cudaMalloc(", size_, "): ", cudaGetErrorString(err)));
    }
  }
  ~DeviceBuffer() { cudaFree(base_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  char* at(size_t off) const { return base_ + kGuard + off; }
  // The pattern everywhere, then `bytes` of `src` at `off`. Synchronised: the kernels run on a
  // non-blocking stream, which does not wait for the default stream's memset and copy (and a
  // copy from pageable memory may return before its DMA has landed).
  void reset(size_t off, const void* src, size_t bytes) {
    CUDA_REQUIRE(cudaMemset(base_, kPattern, size_));
    if (bytes) CUDA_REQUIRE(cudaMemcpy(at(off), src, bytes, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  // The region [off, off + bytes) into `out`; false if a byte outside it (up to kGuard bytes
  // either side) is not the pattern.
  bool read(size_t off, size_t bytes, std::vector<unsigned char>& out) const {
    std::vector<unsigned char> all(kGuard + off + bytes + kGuard);
    CUDA_REQUIRE(cudaMemcpy(all.data(), base_, all.size(), cudaMemcpyDeviceToHost));
    out.assign(all.begin() + kGuard + off, all.begin() + kGuard + off + bytes);
    for (size_t i = 0; i < kGuard + off; ++i) {
      if (all[i] != kPattern) return false;
    }
    for (size_t i = kGuard + off + bytes; i < all.size(); ++i) {
      if (all[i] != kPattern) return false;
    }
    return true;
  }

 private:
  char* base_ = nullptr;
  size_t size_;
};

class StreamGuard {
 public:
  StreamGuard() {
    const cudaError_t err = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
    if (err != cudaSuccess) throw Error(detail::cat("cudaStreamCreate: ", cudaGetErrorString(err)));
  }
  ~StreamGuard() { cudaStreamDestroy(s_); }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Inputs

uint32_t fbits(float f) { return rrtest::bit_cast<uint32_t>(f); }
uint64_t dbits(double d) { return rrtest::bit_cast<uint64_t>(d); }

// Mostly ordinary values of mixed magnitudes, and every kind of special: signed zeros,
// infinities, NaNs with random payloads (quiet and signalling), subnormals, arbitrary patterns.
uint32_t rand_f32(Rng& g) {
  const unsigned r = g() % 100;
  const uint32_t sign = (g() & 1) ? 0x80000000u : 0u;
  if (r < 78) {
    const float m = 1.0f + float(g() % (1u << 23)) / float(1u << 23);
    return sign | fbits(std::ldexp(m, int(g() % 61) - 30));
  }
  if (r < 86) return static_cast<uint32_t>(g());
  if (r < 89) return sign;
  if (r < 92) return sign | 0x7F800000u;
  if (r < 96) return sign | 0x7F800000u | std::max<uint32_t>(1, g() & 0x7FFFFFu);
  return sign | std::max<uint32_t>(1, g() & 0x7FFFFFu);
}

uint64_t rand_f64(Rng& g) {
  const unsigned r = g() % 100;
  const uint64_t sign = (g() & 1) ? 0x8000000000000000ull : 0;
  const uint64_t mant = 0x000FFFFFFFFFFFFFull;
  if (r < 78) {
    const double m = 1.0 + double(g() & mant) / double(mant + 1);
    return sign | dbits(std::ldexp(m, int(g() % 401) - 200));
  }
  if (r < 86) return g();
  if (r < 89) return sign;
  if (r < 92) return sign | 0x7FF0000000000000ull;
  if (r < 96) return sign | 0x7FF0000000000000ull | std::max<uint64_t>(1, g() & mant);
  return sign | std::max<uint64_t>(1, g() & mant);
}

// fp16 and bf16 have few enough patterns that random bits cover every kind; add more specials.
uint16_t rand_half(Rng& g, uint16_t inf) {
  const unsigned r = g() % 100;
  const uint16_t sign = (g() & 1) ? 0x8000 : 0;
  const uint16_t mant = static_cast<uint16_t>(~inf & 0x7FFF);
  if (r < 85) return static_cast<uint16_t>(g());
  if (r < 89) return sign;
  if (r < 93) return sign | inf;
  return sign | inf | std::max<uint16_t>(1, static_cast<uint16_t>(g() & mant));
}

bool is_nan_at(DType t, const unsigned char* p, size_t i) {
  switch (t) {
    case DType::Float32:
    case DType::Complex64: {
      uint32_t u;
      std::memcpy(&u, p + 4 * i, 4);
      return (u & 0x7FFFFFFFu) > 0x7F800000u;
    }
    case DType::Float64:
    case DType::Complex128: {
      uint64_t u;
      std::memcpy(&u, p + 8 * i, 8);
      return (u & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull;
    }
    case DType::Float16:
    case DType::BFloat16: {
      uint16_t u;
      std::memcpy(&u, p + 2 * i, 2);
      return (u & 0x7FFF) > (t == DType::Float16 ? 0x7C00 : 0x7F80);
    }
    default:
      return false;
  }
}

// Not NaN and not infinite; `i` counts reals (so components, for complex).
bool is_finite_at(DType t, const unsigned char* p, size_t i) {
  if (t == DType::Complex64) {
    uint32_t u;
    std::memcpy(&u, p + 4 * i, 4);
    return (u & 0x7F800000u) != 0x7F800000u;
  }
  uint64_t u;
  std::memcpy(&u, p + 8 * i, 8);
  return (u & 0x7FF0000000000000ull) != 0x7FF0000000000000ull;
}

template <class T>
void put(unsigned char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// n random elements of t.
std::vector<unsigned char> random_elements(DType t, size_t n, Rng& g) {
  std::vector<unsigned char> v(n * dtype_size(t));
  unsigned char* p = v.data();
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case DType::Float32: put<uint32_t>(p, i, rand_f32(g)); break;
      case DType::Float64: put<uint64_t>(p, i, rand_f64(g)); break;
      case DType::Float16: put<uint16_t>(p, i, rand_half(g, 0x7C00)); break;
      case DType::BFloat16: put<uint16_t>(p, i, rand_half(g, 0x7F80)); break;
      case DType::Complex64:
        put<uint32_t>(p, 2 * i, rand_f32(g));
        put<uint32_t>(p, 2 * i + 1, rand_f32(g));
        break;
      case DType::Complex128:
        put<uint64_t>(p, 2 * i, rand_f64(g));
        put<uint64_t>(p, 2 * i + 1, rand_f64(g));
        break;
      case DType::Bool:
        // 0/1, and now and then another nonzero byte, which both kernels must read as true.
        p[i] = (g() % 32 == 0) ? static_cast<unsigned char>(2 + g() % 254)
                               : static_cast<unsigned char>(g() & 1);
        break;
      default: {
        // Random bits, with the type's extremes, 0 and +-1 sprinkled in (the minimum is the
        // interesting dividend of x / -1).
        const size_t es = dtype_size(t);
        uint64_t bits = g();
        const unsigned r = g() % 64;
        const uint64_t min_bits = uint64_t(1) << (8 * es - 1);
        if (r == 0) bits = min_bits;
        else if (r == 1) bits = min_bits - 1;
        else if (r == 2) bits = 0;
        else if (r == 3) bits = ~uint64_t(0);
        else if (r == 4) bits = 1;
        std::memcpy(p + i * es, &bits, es);  // little-endian: the low bytes
        break;
      }
    }
  }
  return v;
}

// Makes the pair (a, b) one whose CPU result does not depend on the CPU compiler's operand order
// (see the top of this file): at most one NaN per element pair; for complex, at most one
// non-finite component among the four. What is removed becomes an ordinary value.
void drop_double_nans(DType t, std::vector<unsigned char>& a, std::vector<unsigned char>& b,
                      size_t n) {
  if (is_complex(t)) {
    for (size_t i = 0; i < n; ++i) {
      unsigned char* comps[4] = {a.data(), a.data(), b.data(), b.data()};
      const size_t idx[4] = {2 * i, 2 * i + 1, 2 * i, 2 * i + 1};
      bool seen = false;
      for (int k = 0; k < 4; ++k) {
        if (is_finite_at(t, comps[k], idx[k])) continue;
        if (!seen) {
          seen = true;
          continue;
        }
        if (t == DType::Complex64) put<float>(comps[k], idx[k], 0.75f);
        else put<double>(comps[k], idx[k], 0.75);
      }
    }
    return;
  }
  if (!is_floating(t)) return;
  for (size_t i = 0; i < n; ++i) {
    if (!is_nan_at(t, a.data(), i) || !is_nan_at(t, b.data(), i)) continue;
    switch (t) {
      case DType::Float32: put<float>(b.data(), i, 1.5f); break;
      case DType::Float64: put<double>(b.data(), i, 1.5); break;
      case DType::Float16: put<uint16_t>(b.data(), i, 0x3E00); break;  // 1.5
      default: put<uint16_t>(b.data(), i, 0x3FC0); break;               // 1.5
    }
  }
}

std::string hex_elem(DType t, const unsigned char* p, size_t i) {
  const size_t es = dtype_size(t);
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = es; k-- > 0;) {  // little-endian: most significant byte last
    s += digits[p[i * es + k] >> 4];
    s += digits[p[i * es + k] & 15];
  }
  return s;
}

// Reports up to three elements where the GPU's bytes differ from the CPU's.
void expect_same_bytes(DType t, const std::string& what, const std::vector<unsigned char>& cpu,
                       const std::vector<unsigned char>& gpu, const unsigned char* a,
                       const unsigned char* b, int line) {
  if (cpu == gpu) return;
  const size_t es = dtype_size(t);
  const size_t n = cpu.size() / es;
  int shown = 0;
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(cpu.data() + i * es, gpu.data() + i * es, es) == 0) continue;
    ++wrong;
    if (shown++ < 3) {
      rrtest::fail(__FILE__, line, "GPU bytes == CPU bytes",
                   rrtest::message(what, " i=", i, ": a=", hex_elem(t, a, i),
                                   b ? " b=" : "", b ? hex_elem(t, b, i) : "",
                                   " cpu=", hex_elem(t, cpu.data(), i),
                                   " gpu=", hex_elem(t, gpu.data(), i)));
    }
  }
  rrtest::fail(__FILE__, line, "GPU bytes == CPU bytes",
               rrtest::message(what, ": ", wrong, " of ", n, " elements differ"));
}

bool supported(DType t, RedOp op) { return unsupported_reason(t, op) == nullptr; }

using rrtest::Alias;
using rrtest::alias_name;
using rrtest::kAliases;

struct Offsets {
  size_t dst, a, b;  // bytes past a 16-byte boundary
};

// Offsets in elements: all equal (the vector path, with heads of 0, 1 and 3 elements) and
// different (the scalar path). With 16-byte elements every whole-element offset is aligned, so
// complex128 also gets 8-byte offsets. The large count gets fewer: it is there for the
// grid-stride loop, not for the head and tail.
std::vector<Offsets> offsets_for(DType t, size_t n) {
  const size_t es = dtype_size(t);
  std::vector<Offsets> out;
  const size_t all[][3] = {{0, 0, 0}, {1, 1, 1}, {3, 3, 3}, {0, 1, 3},
                           {1, 0, 0}, {3, 0, 3}, {0, 3, 1}};
  const size_t big[][3] = {{0, 0, 0}, {3, 3, 3}, {0, 1, 3}};
  if (n == kBig) {
    for (const auto& o : big) out.push_back({o[0] * es, o[1] * es, o[2] * es});
  } else {
    for (const auto& o : all) out.push_back({o[0] * es, o[1] * es, o[2] * es});
  }
  if (es == 16) {
    out.push_back({8, 8, 8});
    out.push_back({0, 8, 8});
  }
  return out;
}

constexpr size_t kMaxOffset = 3 * 16;

// ---------------------------------------------------------------------------------------------
// Device check

// True if a CUDA device is usable; otherwise `why` says what is missing.
bool have_device(std::string& why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    why = cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    why = "cudaGetDeviceCount returned 0";
    return false;
  }
  return true;
}

#define EXPECT_ERROR_NAMING(expr, ...) RR_EXPECT_THROW_NAMING(Error, expr, __VA_ARGS__)

}  // namespace

// =============================================================================================
// reduce

RR_TEST(reduce_matches_cpu_all_dtypes_ops_counts_offsets_aliasing) {
  Rng g(20240917);
  StreamGuard stream;
  const size_t max_bytes = kBig * 16 + kMaxOffset;
  DeviceBuffer dA(max_bytes), dB(max_bytes), dD(max_bytes);
  size_t cases = 0;
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (size_t n : kCounts) {
      // One draw per dtype and count, shared by its ops and layouts: drawing 2^20 elements costs
      // more than reducing them.
      std::vector<unsigned char> a0 = random_elements(t, n, g);
      std::vector<unsigned char> b0 = random_elements(t, n, g);
      drop_double_nans(t, a0, b0, n);
      const size_t bytes = n * es;
      for (RedOp op : kAllRedOps) {
        if (!supported(t, op)) continue;
        for (const Offsets& off : offsets_for(t, n)) {
          for (Alias mode : kAliases) {
            // The large count is for the grid-stride loop; a == b adds nothing there.
            if (n == kBig && (mode == Alias::SameInputs || mode == Alias::AllSame)) continue;
            const bool same_inputs = mode == Alias::SameInputs || mode == Alias::AllSame;
            // CPU, on copies laid out as the device buffers are aliased.
            std::vector<unsigned char> ha(a0), hb(b0), hd(bytes);
            const unsigned char* ca = ha.data();
            const unsigned char* cb = same_inputs ? ha.data() : hb.data();
            unsigned char* cd = hd.data();
            if (mode == Alias::DstIsA || mode == Alias::AllSame) cd = ha.data();
            if (mode == Alias::DstIsB) cd = hb.data();
            reduce(cd, ca, cb, n, t, op);
            const std::vector<unsigned char> cpu(cd, cd + bytes);

            // GPU, from the same inputs.
            dA.reset(off.a, a0.data(), bytes);
            dB.reset(off.b, b0.data(), bytes);
            dD.reset(off.dst, nullptr, 0);
            const char* ga = dA.at(off.a);
            const char* gb = same_inputs ? ga : dB.at(off.b);
            DeviceBuffer* out = &dD;
            size_t out_off = off.dst;
            if (mode == Alias::DstIsA || mode == Alias::AllSame) {
              out = &dA;
              out_off = off.a;
            } else if (mode == Alias::DstIsB) {
              out = &dB;
              out_off = off.b;
            }
            cuda::reduce(out->at(out_off), ga, gb, n, t, op, stream.get());
            CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
            ++cases;

            const std::string what = rrtest::message(
                dtype_name(t), " ", redop_name(op), " n=", n, " ", alias_name(mode),
                " offsets dst/a/b=", off.dst, "/", off.a, "/", off.b, " bytes");
            std::vector<unsigned char> gpu;
            RR_EXPECT(out->read(out_off, bytes, gpu), what, ": wrote outside the output");
            expect_same_bytes(t, what, cpu, gpu, a0.data(), same_inputs ? a0.data() : b0.data(),
                              __LINE__);
            // Inputs that are not the output are left alone (in the big case only the first,
            // to keep the copies back down).
            if (out != &dA && (n != kBig || mode == Alias::None)) {
              std::vector<unsigned char> back;
              RR_EXPECT(dA.read(off.a, bytes, back) && back == a0, what, ": a modified");
            }
            if (out != &dB && !same_inputs && n != kBig) {
              std::vector<unsigned char> back;
              RR_EXPECT(dB.read(off.b, bytes, back) && back == b0, what, ": b modified");
            }
            if (rrtest::state().failures > 20) return;  // one bug, thousands of cases
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 5000, "ran ", cases, " cases");
}

// Every fp16 and bf16 pattern through the widening and narrowing: x + -0 is x for every x (NaNs
// come back quiet, payload kept), and x * y over a shuffled copy exercises the rounding.
RR_TEST(half_types_all_patterns) {
  Rng g(7);
  StreamGuard stream;
  const size_t n = 65536;
  DeviceBuffer dA(2 * n), dB(2 * n), dD(2 * n);
  for (DType t : {DType::Float16, DType::BFloat16}) {
    std::vector<unsigned char> a(2 * n), zeros(2 * n), shuffled;
    for (size_t i = 0; i < n; ++i) {
      put<uint16_t>(a.data(), i, static_cast<uint16_t>(i));
      put<uint16_t>(zeros.data(), i, 0x8000);
    }
    shuffled = a;
    for (size_t i = n - 1; i > 0; --i) {  // Fisher-Yates, on 2-byte elements
      const size_t j = g() % (i + 1);
      std::swap(shuffled[2 * i], shuffled[2 * j]);
      std::swap(shuffled[2 * i + 1], shuffled[2 * j + 1]);
    }
    drop_double_nans(t, a, shuffled, n);
    for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max}) {
      for (int second = 0; second < 2; ++second) {
        const std::vector<unsigned char>& b = second ? shuffled : zeros;
        std::vector<unsigned char> cpu(2 * n);
        reduce(cpu.data(), a.data(), b.data(), n, t, op);
        dA.reset(0, a.data(), 2 * n);
        dB.reset(0, b.data(), 2 * n);
        dD.reset(0, nullptr, 0);
        cuda::reduce(dD.at(0), dA.at(0), dB.at(0), n, t, op, stream.get());
        CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
        std::vector<unsigned char> gpu;
        RR_EXPECT(dD.read(0, 2 * n, gpu), "wrote outside");
        expect_same_bytes(t,
                          rrtest::message(dtype_name(t), " ", redop_name(op),
                                          second ? " shuffled patterns" : " -0"),
                          cpu, gpu, a.data(), b.data(), __LINE__);
      }
    }
  }
}

// Two NaN operands: what the sweep leaves out. The GPU returns the first operand's NaN, quiet,
// as x86 does for the operand order written in the source; the CPU returns one of the two
// (which one is its compiler's choice). min and max are selects, not arithmetic, so there the
// CPU's answer is fixed and must be matched exactly.
RR_TEST(both_operands_nan) {
  StreamGuard stream;
  DeviceBuffer dA(64), dB(64), dD(64);
  struct Case {
    DType t;
    uint64_t a, b;       // two different NaNs, the first signalling
    uint64_t quiet_a, quiet_b;
  };
  const Case cases[] = {
      {DType::Float32, 0x7F800123u, 0xFFC00456u, 0x7FC00123u, 0xFFC00456u},
      {DType::Float64, 0x7FF0000000000123ull, 0xFFF8000000000456ull, 0x7FF8000000000123ull,
       0xFFF8000000000456ull},
      {DType::Float16, 0x7C12, 0xFE34, 0x7E12, 0xFE34},
      {DType::BFloat16, 0x7F92, 0xFFC4, 0x7FD2, 0xFFC4},
  };
  for (const Case& c : cases) {
    const size_t es = dtype_size(c.t);
    for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max}) {
      std::vector<unsigned char> a(es), b(es), cpu(es);
      std::memcpy(a.data(), &c.a, es);
      std::memcpy(b.data(), &c.b, es);
      reduce(cpu.data(), a.data(), b.data(), 1, c.t, op);
      dA.reset(0, a.data(), es);
      dB.reset(0, b.data(), es);
      dD.reset(0, nullptr, 0);
      cuda::reduce(dD.at(0), dA.at(0), dB.at(0), 1, c.t, op, stream.get());
      CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
      std::vector<unsigned char> gpu;
      RR_EXPECT(dD.read(0, es, gpu), "wrote outside");
      uint64_t got = 0, cpu_bits = 0;
      std::memcpy(&got, gpu.data(), es);
      std::memcpy(&cpu_bits, cpu.data(), es);
      const std::string what = rrtest::message(dtype_name(c.t), " ", redop_name(op));
      if (op == RedOp::Min || op == RedOp::Max) {
        RR_EXPECT(got == cpu_bits, what, ": gpu ", hex_elem(c.t, gpu.data(), 0), " cpu ",
                  hex_elem(c.t, cpu.data(), 0));
      } else {
        RR_EXPECT(got == c.quiet_a, what, ": gpu ", hex_elem(c.t, gpu.data(), 0),
                  ", want a's NaN, quiet");
        RR_EXPECT(cpu_bits == c.quiet_a || cpu_bits == c.quiet_b, what, ": cpu ",
                  hex_elem(c.t, cpu.data(), 0), " is neither operand's NaN");
      }
    }
  }
}

RR_TEST(reduce_unsupported_and_bad_arguments_throw) {
  StreamGuard stream;
  DeviceBuffer d(256);
  void* p = d.at(0);
  for (DType t : kAllDTypes) {
    for (RedOp op : kAllRedOps) {
      if (supported(t, op)) continue;
      // Also for n = 0: an invalid combination is a bug whatever the size.
      EXPECT_ERROR_NAMING(cuda::reduce(p, p, p, 1, t, op, stream.get()), dtype_name(t),
                          redop_name(op));
      EXPECT_ERROR_NAMING(cuda::reduce(p, p, p, 0, t, op, stream.get()), dtype_name(t),
                          redop_name(op));
    }
  }
  EXPECT_ERROR_NAMING(cuda::reduce(p, p, p, 1, static_cast<DType>(99), RedOp::Sum, stream.get()),
                      "dtype");
  EXPECT_ERROR_NAMING(cuda::reduce(p, p, p, 1, DType::Float32, static_cast<RedOp>(99),
                                   stream.get()),
                      "op");
  char* c = d.at(0);
  EXPECT_ERROR_NAMING(cuda::reduce(c + 4, c, c + 128, 8, DType::Float32, RedOp::Sum, stream.get()),
                      "overlap", "float32");
  EXPECT_ERROR_NAMING(cuda::reduce(nullptr, c, c + 128, 8, DType::Float32, RedOp::Sum,
                                   stream.get()),
                      "null", "float32");
  EXPECT_ERROR_NAMING(cuda::reduce(c + 2, c + 66, c + 130, 8, DType::Float32, RedOp::Sum,
                                   stream.get()),
                      "aligned", "float32");
  cuda::reduce(nullptr, nullptr, nullptr, 0, DType::Float32, RedOp::Sum, stream.get());
  CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
}

// =============================================================================================
// divide

RR_TEST(divide_matches_cpu) {
  Rng g(99);
  StreamGuard stream;
  const size_t max_bytes = kBig * 16 + kMaxOffset;
  DeviceBuffer dS(max_bytes), dD(max_bytes);
  const int64_t divisors[] = {1, 3, -7, -1};
  for (DType t : kAllDTypes) {
    if (t == DType::Bool) continue;
    const size_t es = dtype_size(t);
    for (size_t n : kCounts) {
      const std::vector<unsigned char> s0 = random_elements(t, n, g);
      const size_t bytes = n * es;
      for (int64_t dv : divisors) {
        if (n == kBig && (dv == 1 || dv == -7)) continue;  // 3 and -1 cover both kernels there
        for (const Offsets& off : offsets_for(t, n)) {
          for (int in_place = 0; in_place < 2; ++in_place) {
            std::vector<unsigned char> hs(s0), hd(bytes);
            unsigned char* cd = in_place ? hs.data() : hd.data();
            divide(cd, hs.data(), n, t, dv);
            const std::vector<unsigned char> cpu(cd, cd + bytes);

            dS.reset(off.a, s0.data(), bytes);
            dD.reset(off.dst, nullptr, 0);
            DeviceBuffer* out = in_place ? &dS : &dD;
            const size_t out_off = in_place ? off.a : off.dst;
            cuda::divide(out->at(out_off), dS.at(off.a), n, t, dv, stream.get());
            CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));

            const std::string what =
                rrtest::message(dtype_name(t), " / ", dv, " n=", n, in_place ? " in place" : "",
                                " offsets dst/src=", out_off, "/", off.a, " bytes");
            std::vector<unsigned char> gpu;
            RR_EXPECT(out->read(out_off, bytes, gpu), what, ": wrote outside the output");
            expect_same_bytes(t, what, cpu, gpu, s0.data(), nullptr, __LINE__);
            if (rrtest::state().failures > 20) return;
          }
        }
      }
    }
  }
}

RR_TEST(divide_integer_minimum_by_minus_one_wraps) {
  // The CPU negates with wraparound (x86 would trap on INT64_MIN / -1); so must the GPU.
  StreamGuard stream;
  DeviceBuffer dS(64), dD(64);
  const int64_t src[3] = {std::numeric_limits<int64_t>::min(), -5, 7};
  dS.reset(0, src, sizeof src);
  cuda::divide(dD.at(0), dS.at(0), 3, DType::Int64, -1, stream.get());
  CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  int64_t got[3];
  CUDA_REQUIRE(cudaMemcpy(got, dD.at(0), sizeof got, cudaMemcpyDeviceToHost));
  RR_EXPECT(got[0] == std::numeric_limits<int64_t>::min() && got[1] == 5 && got[2] == -7, got[0],
            " ", got[1], " ", got[2]);
  const int8_t s8[2] = {-128, -7};
  dS.reset(0, s8, sizeof s8);
  cuda::divide(dD.at(0), dS.at(0), 2, DType::Int8, -1, stream.get());
  cuda::divide(dD.at(2), dS.at(0), 2, DType::Int8, 2, stream.get());
  CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  int8_t o8[4];
  CUDA_REQUIRE(cudaMemcpy(o8, dD.at(0), sizeof o8, cudaMemcpyDeviceToHost));
  RR_EXPECT(o8[0] == -128 && o8[1] == 7, int(o8[0]), " ", int(o8[1]));
  RR_EXPECT(o8[2] == -64 && o8[3] == -3, int(o8[2]), " ", int(o8[3]));  // toward zero
}

RR_TEST(divide_rejects_bool_and_zero) {
  StreamGuard stream;
  DeviceBuffer d(64);
  EXPECT_ERROR_NAMING(cuda::divide(d.at(0), d.at(0), 4, DType::Bool, 2, stream.get()), "bool",
                      "divide");
  EXPECT_ERROR_NAMING(cuda::divide(d.at(0), d.at(0), 0, DType::Bool, 2, stream.get()), "bool",
                      "divide");
  EXPECT_ERROR_NAMING(cuda::divide(d.at(0), d.at(0), 4, DType::Float32, 0, stream.get()),
                      "float32", "divide", "zero");
}

// =============================================================================================
// copy, and the Kernels interface

RR_TEST(copy_sizes_offsets) {
  Rng g(5);
  StreamGuard stream;
  const size_t max = kBig + 64;
  DeviceBuffer dS(max), dD(max);
  for (size_t n : kCounts) {
    std::vector<unsigned char> src(n);
    for (auto& c : src) c = static_cast<unsigned char>(g());
    for (size_t soff : {0, 1, 3, 16}) {
      for (size_t doff : {0, 1, 5, 48}) {
        dS.reset(soff, src.data(), n);
        dD.reset(doff, nullptr, 0);
        cuda::copy(dD.at(doff), dS.at(soff), n, stream.get());
        CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
        std::vector<unsigned char> got;
        RR_EXPECT(dD.read(doff, n, got), "n=", n, " soff=", soff, " doff=", doff,
                  ": wrote outside");
        RR_EXPECT(got == src, "n=", n, " soff=", soff, " doff=", doff);
      }
    }
  }
  cuda::copy(dS.at(0), dS.at(0), 128, stream.get());  // a no-op
  cuda::copy(nullptr, nullptr, 0, stream.get());
  RR_EXPECT_THROWS(cuda::copy(dS.at(1), dS.at(0), 128, stream.get()), "overlap");
  CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
}

// The device window's kernels (algo/device_oneshot.cpp): the row, or the slot, is picked on the
// device from a turn counter, (turn - lag) & 1, and nothing is written while the abort word is set.
RR_TEST(turn_picks_the_row_on_the_device) {
  StreamGuard stream;
  const size_t n = 1000, bytes = 4 * n;
  const int nin = 3;
  std::vector<std::vector<float>> host(2 * nin, std::vector<float>(n));
  for (int k = 0; k < 2 * nin; ++k) {
    for (size_t i = 0; i < n; ++i) host[k][i] = float(k * 1000 + int(i % 97)) * 0.25f;
  }
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  const void* row[2][nin];
  for (int k = 0; k < 2 * nin; ++k) {
    bufs.push_back(std::make_unique<DeviceBuffer>(bytes));
    bufs[k]->reset(0, host[k].data(), bytes);
    row[k / nin][k % nin] = bufs[k]->at(0);
  }
  DeviceBuffer words(64), out(bytes), slot0(bytes), slot1(bytes);
  auto* turn = reinterpret_cast<volatile uint32_t*>(words.at(0));
  auto* abort = reinterpret_cast<volatile uint32_t*>(words.at(16));
  auto set = [&](uint32_t t, uint32_t a) {
    const uint32_t w[2] = {t, a};
    CUDA_REQUIRE(cudaMemcpy(words.at(0), &w[0], 4, cudaMemcpyHostToDevice));
    CUDA_REQUIRE(cudaMemcpy(words.at(16), &w[1], 4, cudaMemcpyHostToDevice));
  };
  for (uint32_t t : {0u, 1u, 2u, 7u}) {
    for (uint32_t lag : {0u, 1u}) {
      const int want_row = int((t - lag) & 1u);
      std::vector<float> want(n);
      reduce(want.data(), host[want_row * nin].data(), host[want_row * nin + 1].data(), n, DType::Float32,
             RedOp::Sum);
      reduce(want.data(), want.data(), host[want_row * nin + 2].data(), n, DType::Float32, RedOp::Sum);
      set(t, 0);
      out.reset(0, nullptr, 0);
      cuda::reduce_turn(out.at(0), row[0], row[1], nin, n, DType::Float32, RedOp::Sum, abort, turn, lag,
                        stream.get());
      CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
      std::vector<unsigned char> got;
      RR_EXPECT(out.read(0, bytes, got), "turn ", t, " lag ", lag, ": wrote outside");
      RR_EXPECT(std::memcmp(got.data(), want.data(), bytes) == 0, "turn ", t, " lag ", lag, ": not row ",
                want_row);
      // The staging copy, lag 0: into slot1 on odd turns, slot0 on even ones.
      slot0.reset(0, nullptr, 0);
      slot1.reset(0, nullptr, 0);
      cuda::copy_turn(slot0.at(0), slot1.at(0), bufs[0]->at(0), bytes, abort, turn, stream.get());
      CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
      std::vector<unsigned char> s0, s1;
      RR_EXPECT(slot0.read(0, bytes, s0) && slot1.read(0, bytes, s1), "copy_turn wrote outside");
      const auto& filled = (t & 1u) ? s1 : s0;
      const auto& empty = (t & 1u) ? s0 : s1;
      RR_EXPECT(std::memcmp(filled.data(), host[0].data(), bytes) == 0, "copy_turn, turn ", t);
      RR_EXPECT(std::all_of(empty.begin(), empty.end(), [](unsigned char c) { return c == DeviceBuffer::kPattern; }),
                "copy_turn wrote the other slot, turn ", t);
    }
  }
  // Aborted: neither kernel writes.
  set(1, 1);
  out.reset(0, nullptr, 0);
  slot0.reset(0, nullptr, 0);
  slot1.reset(0, nullptr, 0);
  cuda::reduce_turn(out.at(0), row[0], row[1], nin, n, DType::Float32, RedOp::Sum, abort, turn, 1, stream.get());
  cuda::copy_turn(slot0.at(0), slot1.at(0), bufs[0]->at(0), bytes, abort, turn, stream.get());
  CUDA_REQUIRE(cudaStreamSynchronize(stream.get()));
  for (DeviceBuffer* b : {&out, &slot0, &slot1}) {
    std::vector<unsigned char> got;
    RR_EXPECT(b->read(0, bytes, got), "wrote outside while aborted");
    RR_EXPECT(std::all_of(got.begin(), got.end(), [](unsigned char c) { return c == DeviceBuffer::kPattern; }),
              "a kernel wrote while the abort word was set");
  }
  RR_EXPECT_THROWS(cuda::reduce_turn(out.at(0), row[0], nullptr, nin, n, DType::Float32, RedOp::Sum, abort,
                                     turn, 1, stream.get()),
                   "second row");
}

RR_TEST(kernels_interface_and_default_stream) {
  // Through the Kernels interface the ring uses, on the legacy default stream.
  const size_t n = 1000;
  std::vector<float> a(n), b(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = float(i) * 0.5f;
    b[i] = 3.0f - float(i);
  }
  reduce(want.data(), a.data(), b.data(), n, DType::Float32, RedOp::Sum);
  divide(want.data(), want.data(), n, DType::Float32, 3);
  DeviceBuffer dA(4 * n), dB(4 * n), dD(4 * n);
  dA.reset(0, a.data(), 4 * n);
  dB.reset(0, b.data(), 4 * n);
  cuda::CudaKernels k(nullptr);
  Kernels& kernels = k;
  kernels.reduce(dD.at(0), dA.at(0), dB.at(0), n, DType::Float32, RedOp::Sum);
  kernels.divide(dD.at(0), dD.at(0), n, DType::Float32, 3);
  kernels.copy(dA.at(0), dD.at(0), 4 * n, true);
  CUDA_REQUIRE(cudaDeviceSynchronize());
  std::vector<float> got(n);
  CUDA_REQUIRE(cudaMemcpy(got.data(), dA.at(0), 4 * n, cudaMemcpyDeviceToHost));
  RR_EXPECT(std::memcmp(got.data(), want.data(), 4 * n) == 0, "reduce, divide, copy");
}

int main(int argc, char** argv) {
  std::string why;
  if (!have_device(why)) {
    std::printf("test_reduce_cuda: skipped: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  return rrtest::run_all(argc, argv);
}

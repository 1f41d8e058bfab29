// Tests of the CPU kernels (csrc/reduce) and the dtype table (csrc/common/dtype) against references
// written from the definitions: values are decoded to double, the op is done in double, and the
// result is rounded to the element type with a rounding function that follows the IEEE definition
// rather than any trick the kernels use.
//
// Results are compared bit for bit. The reference does an op in double and rounds the result to
// fp32 (and from there to fp16/bf16, as the kernels do): for + - * / on fp32 inputs that is the
// correctly rounded fp32 result, because rounding first to a format with at least 2p+2 bits (double:
// 53 >= 2*24+2) and then to p bits is the same as rounding once.

#include "reduce_reference.h"

// =============================================================================================
// dtype table

RR_TEST(dtype_table) {
  struct Row {
    DType t;
    size_t size;
    const char* name;
    bool floating, complex, integral;
  };
  const Row rows[] = {
      {DType::Float32, 4, "float32", true, false, false},
      {DType::Float64, 8, "float64", true, false, false},
      {DType::Float16, 2, "float16", true, false, false},
      {DType::BFloat16, 2, "bfloat16", true, false, false},
      {DType::Int8, 1, "int8", false, false, true},
      {DType::UInt8, 1, "uint8", false, false, true},
      {DType::Int16, 2, "int16", false, false, true},
      {DType::Int32, 4, "int32", false, false, true},
      {DType::Int64, 8, "int64", false, false, true},
      {DType::Bool, 1, "bool", false, false, true},
      {DType::Complex64, 8, "complex64", false, true, false},
      {DType::Complex128, 16, "complex128", false, true, false},
  };
  for (const Row& r : rows) {
    RR_EXPECT(dtype_size(r.t) == r.size, r.name);
    RR_EXPECT(std::string(dtype_name(r.t)) == r.name, dtype_name(r.t), " vs ", r.name);
    RR_EXPECT(is_floating(r.t) == r.floating, r.name);
    RR_EXPECT(is_complex(r.t) == r.complex, r.name);
    RR_EXPECT(is_integral(r.t) == r.integral, r.name);
  }
  const char* op_names[] = {"sum", "product", "min", "max", "band", "bor", "bxor"};
  for (size_t i = 0; i < 7; ++i) {
    RR_EXPECT(std::string(redop_name(kAllRedOps[i])) == op_names[i], redop_name(kAllRedOps[i]));
  }
  RR_EXPECT_THROWS(dtype_size(static_cast<DType>(200)), "unknown dtype");
  RR_EXPECT(unsupported_reason(static_cast<DType>(200), RedOp::Sum) != nullptr);
  RR_EXPECT(unsupported_reason(DType::Float32, static_cast<RedOp>(200)) != nullptr);
}

RR_TEST(unsupported_reason_matrix) {
  for (DType t : kAllDTypes) {
    for (RedOp op : kAllRedOps) {
      const char* why = unsupported_reason(t, op);
      RR_EXPECT((why == nullptr) == supported(t, op), dtype_name(t), " ", redop_name(op), ": ",
                why ? why : "(supported)");
      if (!why) continue;
      if (is_complex(t) && (op == RedOp::Min || op == RedOp::Max)) {
        RR_EXPECT(std::strstr(why, "complex") && std::strstr(why, redop_name(op)), why);
      } else {
        RR_EXPECT(std::strstr(why, "bitwise") && std::strstr(why, "integer"), why);
      }
    }
  }
}

// =============================================================================================
// fp16 / bf16 conversions

RR_TEST(fp16_to_float_all_patterns) {
  const bool hw = have_f16c();
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = fp16_to_float(static_cast<uint16_t>(h));
    const double want = ref_decode(h, kF16);
    if (std::isnan(want)) {
      // NaN: made quiet, payload kept in the top mantissa bits, sign kept.
      const uint32_t g = fbits(got);
      RR_EXPECT(std::isnan(got), "h=", h);
      RR_EXPECT(((g >> 13) & 0x3FF) == ((h & 0x3FF) | 0x200), "h=", h, " got bits ", g);
      RR_EXPECT((g >> 31) == (h >> 15), "h=", h);
    } else {
      RR_EXPECT(same_value(got, want), "h=", h, " want ", want, " got ", got);
    }
    if (hw) RR_EXPECT(fbits(got) == fbits(hw_fp16_to_float(static_cast<uint16_t>(h))), "h=", h);
  }
}

RR_TEST(fp16_round_trip_all_patterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = float_to_fp16(fp16_to_float(static_cast<uint16_t>(h)));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    const uint32_t want = nan ? (h | 0x200) : h;  // a NaN comes back quiet
    RR_EXPECT(back == want, "h=", h, " back=", back);
  }
}

// Every rounding boundary of fp16: the midpoint between each pair of neighbours, and the floats
// just either side of it, plus a stride through all float bit patterns.
RR_TEST(float_to_fp16_rounding) {
  const bool hw = have_f16c();
  auto check = [&](float f) {
    const uint16_t got = float_to_fp16(f);
    const uint32_t u = fbits(f);
    uint32_t want;
    if (std::isnan(f)) want = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF);
    else want = static_cast<uint32_t>(ref_encode(ref_round(f, kF16), kF16));
    RR_EXPECT(got == want, "f=", f, " (bits ", u, ") want ", want, " got ", got);
    if (hw) RR_EXPECT(got == hw_float_to_fp16(f), "f=", f, " (bits ", u, ") vs F16C");
  };
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    for (double sign : {1.0, -1.0}) {
      const double lo = ref_decode(h, kF16);
      const double hi = h + 1 < 0x7C00 ? ref_decode(h + 1, kF16) : 65536.0;  // 65536: "next" past max
      const float mid = static_cast<float>(sign * (lo + hi) / 2);  // 12 significant bits: exact
      check(mid);
      check(std::nextafter(mid, 0.0f));
      check(std::nextafter(mid, static_cast<float>(sign) * std::numeric_limits<float>::infinity()));
    }
  }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 997) check(ffrom(static_cast<uint32_t>(u)));
  check(ffrom(0x7F800001u));  // signalling NaN
  check(ffrom(0xFF800001u));
}

RR_TEST(bf16_conversions) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    RR_EXPECT(fbits(f) == h << 16, "h=", h);
    const double want = ref_decode(h, kBF16);
    RR_EXPECT(same_value(f, want), "h=", h);
    const uint16_t back = float_to_bf16(f);
    const bool nan = (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0;
    RR_EXPECT(back == (nan ? (h | 0x40) : h), "h=", h, " back=", back);
  }
  auto check = [&](float f) {
    const uint16_t got = float_to_bf16(f);
    const uint32_t u = fbits(f);
    if (std::isnan(f)) {
      RR_EXPECT(got == ((u >> 16) | 0x40), "bits ", u, " got ", got);
    } else {
      const uint64_t want = ref_encode(ref_round(f, kBF16), kBF16);
      RR_EXPECT(got == want, "f=", f, " (bits ", u, ") want ", want, " got ", got);
    }
  };
  for (uint32_t h = 0; h < 0x7F80; ++h) {
    for (double sign : {1.0, -1.0}) {
      const double lo = ref_decode(h, kBF16);
      const double hi = h + 1 < 0x7F80 ? ref_decode(h + 1, kBF16) : std::ldexp(1.0, 128);
      const double mid_d = sign * (lo + hi) / 2;
      if (std::fabs(mid_d) > std::numeric_limits<float>::max()) continue;
      const float mid = static_cast<float>(mid_d);
      check(mid);
      check(std::nextafter(mid, 0.0f));
      check(std::nextafter(mid, static_cast<float>(sign) * std::numeric_limits<float>::infinity()));
    }
  }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 997) check(ffrom(static_cast<uint32_t>(u)));
}

// The reference rounding itself, against the compiler's double -> float conversion.
RR_TEST(reference_rounding_matches_float_cast) {
  Rng g(7);
  for (int i = 0; i < 200000; ++i) {
    uint64_t b = g();
    double x;
    std::memcpy(&x, &b, 8);
    int e;
    x = std::ldexp(std::frexp(x, &e), int(g() % 300) - 160);  // around float's range
    if (std::isnan(x) || std::fabs(x) > std::numeric_limits<float>::max()) continue;
    const float f = static_cast<float>(x);
    RR_EXPECT(same_value(ref_round(x, kF32), f), "x=", x);
    RR_EXPECT(ref_encode(f, kF32) == fbits(f), "x=", x);
  }
}

// =============================================================================================
// reduce

RR_TEST(reduce_all_dtypes_ops_counts_alignments_aliasing) {
  Rng g(12345);
  const auto& modes = rrtest::kAliases;
  size_t cases = 0;
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (RedOp op : kAllRedOps) {
      if (!supported(t, op)) continue;
      for (size_t n : kCounts) {
        for (size_t offset : {size_t(0), size_t(1)}) {  // in elements
          for (Alias mode : modes) {
            const size_t bytes = n * es;
            GuardedBuffer A(bytes, offset * es), B(bytes, offset * es), D(bytes, offset * es);
            fill_random(t, A.data(), n, g);
            fill_random(t, B.data(), n, g);
            void* a = A.data();
            void* b = (mode == Alias::SameInputs || mode == Alias::AllSame) ? A.data() : B.data();
            void* dst = D.data();
            if (mode == Alias::DstIsA || mode == Alias::AllSame) dst = a;
            if (mode == Alias::DstIsB) dst = b;
            const std::vector<unsigned char> a0(A.data(), A.data() + bytes);
            const std::vector<unsigned char> b0(static_cast<unsigned char*>(b),
                                                static_cast<unsigned char*>(b) + bytes);
            reduce(dst, a, b, n, t, op);
            ++cases;
            int bad = 0;
            for (size_t i = 0; i < n && bad < 3; ++i) {
              const std::string why = check_reduce_elem(t, op, a0.data(), b0.data(), dst, i);
              if (!why.empty()) {
                ++bad;
                rrtest::fail(__FILE__, __LINE__, "reduce result",
                             rrtest::message(dtype_name(t), " ", redop_name(op), " n=", n,
                                             " offset=", offset, " ", alias_name(mode), " i=", i,
                                             ": a=", hex_bytes(t, a0.data(), i), " b=",
                                             hex_bytes(t, b0.data(), i), " got ",
                                             hex_bytes(t, dst, i), ": ", why));
              }
            }
            RR_EXPECT(A.guards_intact() && B.guards_intact() && D.guards_intact(), dtype_name(t),
                      " ", redop_name(op), " n=", n, " ", alias_name(mode),
                      ": wrote outside the buffer");
            // Inputs that are not the output are left alone. (memcmp: not with n = 0, where the
            // copies' data() may be null.)
            if (n > 0 && dst != a) RR_EXPECT(std::memcmp(a, a0.data(), bytes) == 0, "a modified");
            if (n > 0 && dst != b && b != a) {
              RR_EXPECT(std::memcmp(b, b0.data(), bytes) == 0, "b modified");
            }
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 3000, "ran ", cases, " cases");
}

// reduce_and_copy is defined as reduce(), divide() (unless the divisor is 1) and copy() in turn,
// which the tests above check against the references: it must give the same bytes in both outputs.
RR_TEST(reduce_and_copy_is_reduce_divide_copy_bit_for_bit) {
  Rng g(777);
  size_t cases = 0;
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (RedOp op : kAllRedOps) {
      if (!supported(t, op)) continue;
      for (int64_t dv : {int64_t(1), int64_t(2), int64_t(3), int64_t(-1), int64_t(7)}) {
        if (t == DType::Bool && dv != 1) continue;
        for (size_t n : kCounts) {
          for (int out_is_b = 0; out_is_b < 2; ++out_is_b) {
            const size_t bytes = n * es;
            GuardedBuffer A(bytes, es), B(bytes, es), D(bytes, es), O(bytes, es);
            fill_random(t, A.data(), n, g);
            fill_random(t, B.data(), n, g);
            const std::vector<unsigned char> a0(A.data(), A.data() + bytes);
            const std::vector<unsigned char> b0(B.data(), B.data() + bytes);
            // The reference: the three calls, on copies.
            std::vector<unsigned char> want(bytes + 1);
            if (n > 0) {
              reduce(want.data(), a0.data(), b0.data(), n, t, op);
              if (dv != 1) divide(want.data(), want.data(), n, t, dv);
            }
            void* out = out_is_b ? B.data() : O.data();
            reduce_and_copy(D.data(), out, A.data(), B.data(), n, t, op, dv);
            ++cases;
            const std::string what = rrtest::message(dtype_name(t), " ", redop_name(op), " / ", dv,
                                                     " n=", n, out_is_b ? " out=b" : "");
            if (n > 0) {
              RR_EXPECT(std::memcmp(D.data(), want.data(), bytes) == 0, what, ": dst differs");
              RR_EXPECT(std::memcmp(out, want.data(), bytes) == 0, what, ": out differs");
              RR_EXPECT(std::memcmp(A.data(), a0.data(), bytes) == 0, what, ": a modified");
              if (!out_is_b) RR_EXPECT(std::memcmp(B.data(), b0.data(), bytes) == 0, what, ": b modified");
            }
            RR_EXPECT(A.guards_intact() && B.guards_intact() && D.guards_intact() &&
                          O.guards_intact(), what, ": wrote outside a buffer");
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 1000, "ran ", cases, " cases");
}

// The streamed forms write their destination with non-temporal stores, block by block: the
// same bytes as the plain calls, for every dtype and op, at counts around the block and the
// streaming threshold, unaligned destinations, and a destination that is an input.
RR_TEST(streamed_kernels_are_the_plain_ones_bit_for_bit) {
  Rng g(4242);
  size_t cases = 0;
  Kernels& k = cpu_kernels();
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (RedOp op : kAllRedOps) {
      if (!supported(t, op)) continue;
      for (size_t n : {size_t(0), size_t(1), size_t(17), 4096 / es - 1, 4096 / es, 8192 / es + 3,
                       size_t(65536 + 3)}) {
        for (size_t offset : {size_t(0), size_t(1)}) {
          for (int mode = 0; mode < 3; ++mode) {  // 0: distinct, 1: dst is a, 2: dst is b
            const size_t bytes = n * es;
            GuardedBuffer A(bytes, offset * es), B(bytes, offset * es), D(bytes, offset * es),
                W(bytes, 0);
            fill_random(t, A.data(), n, g);
            fill_random(t, B.data(), n, g);
            if (n > 0) reduce(W.data(), A.data(), B.data(), n, t, op);
            void* dst = mode == 1 ? A.data() : mode == 2 ? B.data() : D.data();
            reduce_streamed(dst, A.data(), B.data(), n, t, op);
            ++cases;
            const std::string what = rrtest::message(dtype_name(t), " ", redop_name(op), " n=", n,
                                                     " offset=", offset, " mode=", mode);
            if (n > 0) RR_EXPECT(std::memcmp(dst, W.data(), bytes) == 0, what, ": differs");
            RR_EXPECT(A.guards_intact() && B.guards_intact() && D.guards_intact(), what,
                      ": wrote outside a buffer");
          }
          for (int64_t dv : {int64_t(1), int64_t(3)}) {
            if (t == DType::Bool && dv != 1) continue;
            for (int out_is_b = 0; out_is_b < 2; ++out_is_b) {
              const size_t bytes = n * es;
              GuardedBuffer A(bytes, offset * es), B(bytes, offset * es), D(bytes, 0),
                  O(bytes, offset * es), WD(bytes, 0), WO(bytes, 0), B2(bytes, 0);
              fill_random(t, A.data(), n, g);
              fill_random(t, B.data(), n, g);
              if (n > 0) std::memcpy(B2.data(), B.data(), bytes);
              reduce_and_copy(WD.data(), out_is_b ? B2.data() : WO.data(), A.data(), B2.data(), n,
                              t, op, dv);
              void* out = out_is_b ? B.data() : O.data();
              k.reduce_and_copy_streamed(D.data(), out, A.data(), B.data(), n, t, op, dv);
              ++cases;
              const std::string what = rrtest::message(dtype_name(t), " ", redop_name(op), " / ",
                                                       dv, " n=", n, out_is_b ? " out=b" : "");
              if (n > 0) {
                RR_EXPECT(std::memcmp(D.data(), WD.data(), bytes) == 0, what, ": dst differs");
                RR_EXPECT(std::memcmp(out, WD.data(), bytes) == 0, what, ": out differs");
              }
              RR_EXPECT(A.guards_intact() && B.guards_intact() && D.guards_intact() &&
                            O.guards_intact(), what, ": wrote outside a buffer");
            }
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 1000, "ran ", cases, " cases");
  std::vector<float> buf(4096);
  RR_EXPECT_THROWS(reduce_streamed(buf.data() + 1, buf.data(), buf.data(), 2048, DType::Float32,
                                   RedOp::Sum),
                   "overlap");
}

// Element i is a NaN (a complex one: either part).
bool is_nan_elem(DType t, const void* p, size_t i) {
  if (t == DType::Complex64) return std::isnan(load<float>(p, 2 * i)) || std::isnan(load<float>(p, 2 * i + 1));
  if (t == DType::Complex128) return std::isnan(load<double>(p, 2 * i)) || std::isnan(load<double>(p, 2 * i + 1));
  return std::isnan(float_value(t, p, i));
}

// reduce_many is reduce() m-1 times over its sources in order, then divide(): the ring's fold. The
// same bits (NaN payloads aside: which operand's NaN survives is the compiler's choice in both).
// dst may be one of the sources exactly.
RR_TEST(reduce_many_is_the_ring_fold_bit_for_bit) {
  Rng g(4242);
  size_t cases = 0;
  auto same = [](DType t, const unsigned char* x, const unsigned char* y, size_t n) {
    const size_t es = dtype_size(t);
    for (size_t i = 0; i < n; ++i) {
      if (std::memcmp(x + i * es, y + i * es, es) == 0) continue;
      if (!is_floating(t) && !is_complex(t)) return false;
      if (!(is_nan_elem(t, x, i) && is_nan_elem(t, y, i))) return false;
    }
    return true;
  };
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (RedOp op : kAllRedOps) {
      if (!supported(t, op)) continue;
      for (int m : {1, 2, 3, 5}) {
        for (int64_t dv : {int64_t(1), int64_t(3)}) {
          if (dv != 1 && t == DType::Bool) continue;
          for (size_t n : kCounts) {
            for (int alias = 0; alias < 2; ++alias) {
              const size_t bytes = n * es;
              std::vector<std::vector<unsigned char>> src(m, std::vector<unsigned char>(bytes + 1));
              for (auto& v : src) fill_random(t, v.data(), n, g);
              std::vector<unsigned char> want(bytes + 1);
              if (n > 0) {
                std::memcpy(want.data(), src[0].data(), bytes);
                for (int k = 1; k < m; ++k) reduce(want.data(), want.data(), src[k].data(), n, t, op);
                if (dv != 1) divide(want.data(), want.data(), n, t, dv);
                // A bool result is 0 or 1 even where no step ran (any nonzero byte is true).
                if (t == DType::Bool) {
                  for (size_t i = 0; i < n; ++i) want[i] = want[i] != 0;
                }
              }
              std::vector<const void*> ptrs;
              for (auto& v : src) ptrs.push_back(v.data());
              GuardedBuffer D(bytes, es);
              void* dst = alias ? src[m - 1].data() : D.data();
              reduce_many(dst, ptrs.data(), m, n, t, op, dv);
              ++cases;
              RR_EXPECT(same(t, static_cast<unsigned char*>(dst), want.data(), n), dtype_name(t), " ",
                        redop_name(op), " m=", m, " / ", dv, " n=", n, alias ? " dst=last" : "",
                        ": differs from the fold");
              RR_EXPECT(D.guards_intact(), dtype_name(t), " n=", n, ": wrote outside the buffer");
            }
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 1000, "ran ", cases, " cases");
  std::vector<float> a(8, 1.f), b(8, 2.f);
  const void* two[] = {a.data(), b.data()};
  RR_EXPECT_THROWS(reduce_many(a.data() + 1, two, 2, 4, DType::Float32, RedOp::Sum, 1), "overlaps");
  RR_EXPECT_THROWS(reduce_many(a.data(), two, 0, 4, DType::Float32, RedOp::Sum, 1), "sources");
  RR_EXPECT_THROWS(reduce_many(a.data(), two, 2, 4, DType::Float32, RedOp::BAnd, 1), "band");
}

// reduce_rotated is a reduce_many per chunk, the sources rotated to start after the chunk's
// index: the same kernels, so the same bits, NaN payloads included. Also where dst is one of the
// sources, and with more sources than fit on its stack.
RR_TEST(reduce_rotated_is_reduce_many_per_chunk_bit_for_bit) {
  Rng g(777);
  size_t cases = 0;
  for (DType t : kAllDTypes) {
    const size_t es = dtype_size(t);
    for (RedOp op : kAllRedOps) {
      if (!supported(t, op)) continue;
      for (int m : {1, 2, 3, 5, 17}) {
        for (int64_t dv : {int64_t(1), int64_t(3)}) {
          if (dv != 1 && t == DType::Bool) continue;
          for (size_t n : {size_t(1), size_t(2), size_t(7), size_t(64), size_t(1000)}) {
            for (int alias = 0; alias < 2; ++alias) {
              const size_t bytes = n * es;
              const size_t chunk = (n + m - 1) / m;
              std::vector<std::vector<unsigned char>> src(m, std::vector<unsigned char>(bytes + 1));
              for (auto& v : src) fill_random(t, v.data(), n, g);
              std::vector<const void*> ptrs;
              for (auto& v : src) ptrs.push_back(v.data());
              std::vector<unsigned char> want(bytes + 1);
              for (size_t c = 0, lo = 0; lo < n; ++c, lo += chunk) {
                std::vector<const void*> order;
                for (int k = 0; k < m; ++k) order.push_back(src[(c + 1 + k) % m].data() + lo * es);
                reduce_many(want.data() + lo * es, order.data(), m, std::min(chunk, n - lo), t, op, dv);
              }
              GuardedBuffer D(bytes, es);
              void* dst = alias ? src[m / 2].data() : D.data();
              reduce_rotated(dst, ptrs.data(), m, n, chunk, t, op, dv);
              ++cases;
              RR_EXPECT(std::memcmp(dst, want.data(), bytes) == 0, dtype_name(t), " ", redop_name(op),
                        " m=", m, " / ", dv, " n=", n, alias ? " dst=a source" : "",
                        ": differs from reduce_many per chunk");
              RR_EXPECT(D.guards_intact(), dtype_name(t), " n=", n, ": wrote outside the buffer");
            }
          }
        }
      }
    }
  }
  RR_EXPECT(cases > 1000, "ran ", cases, " cases");
  std::vector<float> a(8, 1.f), b(8, 2.f);
  const void* two[] = {a.data(), b.data()};
  RR_EXPECT_THROWS(reduce_rotated(a.data(), two, 2, 8, 0, DType::Float32, RedOp::Sum, 1), "chunks of 0");
  RR_EXPECT_THROWS(reduce_rotated(a.data() + 1, two, 2, 4, 2, DType::Float32, RedOp::Sum, 1), "overlaps");
  RR_EXPECT_THROWS(reduce_rotated(a.data(), two, 2, 4, 2, DType::Float32, RedOp::BAnd, 1), "band");
}

RR_TEST(reduce_and_copy_rejects_shared_buffers_and_bad_arguments) {
  float a[64] = {}, b[64] = {}, d[64] = {}, o[64] = {};
  reduce_and_copy(d, b, a, b, 32, DType::Float32, RedOp::Sum, 2);  // out == b: an in-place op
  RR_EXPECT_THROWS(reduce_and_copy(d, d, a, b, 32, DType::Float32, RedOp::Sum, 1), "overlaps");
  RR_EXPECT_THROWS(reduce_and_copy(a, o, a, b, 32, DType::Float32, RedOp::Sum, 1), "overlaps");
  RR_EXPECT_THROWS(reduce_and_copy(d, a, a, b, 32, DType::Float32, RedOp::Sum, 1), "overlaps");
  RR_EXPECT_THROWS(reduce_and_copy(d, b + 1, a, b, 32, DType::Float32, RedOp::Sum, 1), "overlap");
  RR_EXPECT_THROWS(reduce_and_copy(d, o, a, b, 32, DType::Float32, RedOp::Sum, 0), "divisor is zero");
  RR_EXPECT_THROWS(reduce_and_copy(d, o, a, b, 32, DType::Bool, RedOp::Max, 2), "bool");
  EXPECT_ERROR_NAMING(reduce_and_copy(d, o, a, b, 4, DType::Float32, RedOp::BAnd, 1), "float32",
                      "band");
  RR_EXPECT_THROWS(reduce_and_copy(nullptr, o, a, b, 32, DType::Float32, RedOp::Sum, 1), "null");
  reduce_and_copy(nullptr, nullptr, nullptr, nullptr, 0, DType::Float32, RedOp::Sum, 1);
}

RR_TEST(reduce_unsupported_throws_naming_dtype_and_op) {
  float buf[8] = {};
  for (DType t : kAllDTypes) {
    for (RedOp op : kAllRedOps) {
      if (supported(t, op)) continue;
      // Also for n = 0: an invalid combination is a bug whatever the size.
      EXPECT_ERROR_NAMING(reduce(buf, buf, buf, 1, t, op), dtype_name(t), redop_name(op));
      EXPECT_ERROR_NAMING(reduce(buf, buf, buf, 0, t, op), dtype_name(t), redop_name(op));
    }
  }
  EXPECT_ERROR_NAMING(reduce(buf, buf, buf, 1, static_cast<DType>(99), RedOp::Sum), "dtype");
}

RR_TEST(reduce_rejects_partial_overlap_and_null) {
  float buf[64] = {};
  float other[64] = {};
  RR_EXPECT_THROWS(reduce(buf + 1, buf, other, 32, DType::Float32, RedOp::Sum), "overlap");
  RR_EXPECT_THROWS(reduce(buf, other, buf + 3, 32, DType::Float32, RedOp::Sum), "overlap");
  RR_EXPECT_THROWS(reduce(nullptr, other, buf, 32, DType::Float32, RedOp::Sum), "null");
  reduce(nullptr, nullptr, nullptr, 0, DType::Float32, RedOp::Sum);  // n = 0: nothing to touch
}

RR_TEST(min_max_propagate_nan) {
  const DType types[] = {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16};
  const size_t n = 37;
  const size_t nan_at[] = {0, 5, 8, 16, 31, 36};
  Rng g(99);
  for (DType t : types) {
    const size_t es = dtype_size(t);
    for (RedOp op : {RedOp::Min, RedOp::Max}) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        std::vector<unsigned char> a(n * es), b(n * es), d(n * es);
        // finite values, then NaN in a at some positions and in b at others
        for (size_t i = 0; i < n; ++i) {
          const double v = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(g), 3);
          const double w = std::ldexp(std::uniform_real_distribution<double>(-1, 1)(g), 3);
          auto set = [&](std::vector<unsigned char>& buf, double x) {
            switch (t) {
              case DType::Float32: put<float>(buf.data(), i, float(x)); break;
              case DType::Float64: put<double>(buf.data(), i, x); break;
              case DType::Float16: put<uint16_t>(buf.data(), i, float_to_fp16(float(x))); break;
              default: put<uint16_t>(buf.data(), i, float_to_bf16(float(x))); break;
            }
          };
          set(a, v);
          set(b, w);
        }
        int k = 0;
        for (size_t i : nan_at) {
          auto& buf = (k++ % 2) ? b : a;
          const double nan = std::numeric_limits<double>::quiet_NaN();
          switch (t) {
            case DType::Float32: put<float>(buf.data(), i, float(nan)); break;
            case DType::Float64: put<double>(buf.data(), i, nan); break;
            case DType::Float16: put<uint16_t>(buf.data(), i, uint16_t(0x7E00)); break;
            default: put<uint16_t>(buf.data(), i, uint16_t(0x7FC0)); break;
          }
        }
        void* out = in_place ? a.data() : d.data();
        reduce(out, a.data(), b.data(), n, t, op);
        for (size_t i = 0; i < n; ++i) {
          const bool want_nan = std::find(std::begin(nan_at), std::end(nan_at), i) != std::end(nan_at);
          RR_EXPECT(std::isnan(float_value(t, out, i)) == want_nan, dtype_name(t), " ",
                    redop_name(op), " i=", i, " got ", float_value(t, out, i));
        }
      }
    }
  }
}

RR_TEST(reduce_spot_values) {
  // A few by hand, so a wrong reference cannot hide a wrong kernel.
  const float a[3] = {1.5f, -2.0f, 3.0f}, b[3] = {2.25f, 4.0f, -1.0f};
  float d[3];
  reduce(d, a, b, 3, DType::Float32, RedOp::Sum);
  RR_EXPECT(d[0] == 3.75f && d[1] == 2.0f && d[2] == 2.0f);
  reduce(d, a, b, 3, DType::Float32, RedOp::Prod);
  RR_EXPECT(d[0] == 3.375f && d[1] == -8.0f && d[2] == -3.0f);
  const int8_t x[2] = {100, -128}, y[2] = {100, -1};
  int8_t z[2];
  reduce(z, x, y, 2, DType::Int8, RedOp::Sum);
  RR_EXPECT(z[0] == -56 && z[1] == 127, int(z[0]), " ", int(z[1]));  // wraps like torch
  const uint16_t h1[1] = {0x3C00}, h2[1] = {0x3C00};  // 1.0 + 1.0 in fp16
  uint16_t h3[1];
  reduce(h3, h1, h2, 1, DType::Float16, RedOp::Sum);
  RR_EXPECT(h3[0] == 0x4000, h3[0]);
  const uint16_t big[1] = {0x7BFF};  // 65504 + 65504 overflows fp16
  reduce(h3, big, big, 1, DType::Float16, RedOp::Sum);
  RR_EXPECT(h3[0] == 0x7C00, h3[0]);
  const float c1[2] = {1, 2}, c2[2] = {3, 4};  // (1+2i)(3+4i) = -5+10i
  float c3[2];
  reduce(c3, c1, c2, 1, DType::Complex64, RedOp::Prod);
  RR_EXPECT(c3[0] == -5 && c3[1] == 10, c3[0], " ", c3[1]);
  const uint8_t p[4] = {0, 1, 2, 0}, q[4] = {0, 0, 7, 3};
  uint8_t r[4];
  reduce(r, p, q, 4, DType::Bool, RedOp::BXor);
  RR_EXPECT(r[0] == 0 && r[1] == 1 && r[2] == 0 && r[3] == 1);
  reduce(r, p, q, 4, DType::Bool, RedOp::Sum);
  RR_EXPECT(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1);
}

// =============================================================================================
// divide and scale

RR_TEST(divide_all_dtypes) {
  Rng g(2024);
  const int64_t divisors[] = {1, 2, 3, 4, 7, -3, -1, 1000};
  for (DType t : kAllDTypes) {
    if (t == DType::Bool) continue;
    const size_t es = dtype_size(t);
    for (int64_t dv : divisors) {
      for (size_t n : {size_t(1), size_t(17), size_t(1009)}) {
        for (int in_place = 0; in_place < 2; ++in_place) {
          GuardedBuffer S(n * es, es), D(n * es, es);
          fill_random(t, S.data(), n, g);
          const std::vector<unsigned char> s0(S.data(), S.data() + n * es);
          void* out = in_place ? S.data() : D.data();
          divide(out, S.data(), n, t, dv);
          int bad = 0;
          for (size_t i = 0; i < n && bad < 3; ++i) {
            std::string why;
            switch (category(t)) {
              case Cat::Float: {
                const double want = round_to(t, float_value(t, s0.data(), i) / double(dv));
                const double got = float_value(t, out, i);
                if (!same_value(got, want)) why = rrtest::message("want ", want, " got ", got);
                break;
              }
              case Cat::Int: {
                const int64_t x = int_value(t, s0.data(), i);
                const int64_t want = dv == -1 ? wrap(t, 0 - static_cast<uint64_t>(x)) : wrap(t, static_cast<uint64_t>(x / dv));
                const int64_t got = int_value(t, out, i);
                if (got != want) why = rrtest::message(x, " / ", dv, ": want ", want, " got ", got);
                break;
              }
              case Cat::Complex: {
                const Cx x = complex_value(t, s0.data(), i), got = complex_value(t, out, i);
                const double wr = round_to(t, x.re / double(dv)), wi = round_to(t, x.im / double(dv));
                if (!same_value(got.re, wr) || !same_value(got.im, wi)) why = "complex quotient";
                break;
              }
              default: break;
            }
            if (!why.empty()) {
              ++bad;
              rrtest::fail(__FILE__, __LINE__, "divide",
                           rrtest::message(dtype_name(t), " /", dv, " n=", n, " i=", i, ": ", why));
            }
          }
          RR_EXPECT(S.guards_intact() && D.guards_intact(), dtype_name(t), ": wrote outside");
        }
      }
    }
  }
}

RR_TEST(divide_integer_truncates_toward_zero) {
  const int32_t src[6] = {-7, 7, -1, 1, -8, 8};
  int32_t out[6];
  divide(out, src, 6, DType::Int32, 2);
  const int32_t want[6] = {-3, 3, 0, 0, -4, 4};
  for (int i = 0; i < 6; ++i) RR_EXPECT(out[i] == want[i], "i=", i, " got ", out[i]);
  divide(out, src, 6, DType::Int32, -2);
  for (int i = 0; i < 6; ++i) RR_EXPECT(out[i] == -want[i], "i=", i, " got ", out[i]);
  const int64_t m[2] = {std::numeric_limits<int64_t>::min(), -5};
  int64_t mo[2];
  divide(mo, m, 2, DType::Int64, -1);  // wraps, does not trap
  RR_EXPECT(mo[0] == std::numeric_limits<int64_t>::min() && mo[1] == 5);
  const int8_t s8[1] = {-128};
  int8_t o8[1];
  divide(o8, s8, 1, DType::Int8, -1);
  RR_EXPECT(o8[0] == -128, int(o8[0]));
  const float f[2] = {1.0f, -3.0f};
  float fo[2];
  divide(fo, f, 2, DType::Float32, 4);
  RR_EXPECT(fo[0] == 0.25f && fo[1] == -0.75f);
}

RR_TEST(divide_rejects_bool_and_zero) {
  uint8_t b[4] = {1, 0, 1, 1};
  EXPECT_ERROR_NAMING(divide(b, b, 4, DType::Bool, 2), "bool", "divide");
  EXPECT_ERROR_NAMING(divide(b, b, 0, DType::Bool, 2), "bool", "divide");
  float f[4] = {};
  EXPECT_ERROR_NAMING(divide(f, f, 4, DType::Float32, 0), "float32", "divide", "zero");
}

RR_TEST(scale_float_and_complex) {
  Rng g(77);
  const double factors[] = {0.5, 3.0, -1.25, 0.1, 1e-3, 1e30};
  for (DType t : kAllDTypes) {
    if (is_integral(t)) {
      std::vector<unsigned char> buf(16 * dtype_size(t));
      EXPECT_ERROR_NAMING(scale(buf.data(), buf.data(), 16, t, 2.0), dtype_name(t), "scale");
      continue;
    }
    const size_t es = dtype_size(t);
    // The kernel rounds the factor to the type it computes in (fp32 except for 64-bit types).
    const bool wide = t == DType::Float64 || t == DType::Complex128;
    for (double f : factors) {
      const double fm = wide ? f : double(float(f));
      for (size_t n : {size_t(1), size_t(16), size_t(1009)}) {
        for (int in_place = 0; in_place < 2; ++in_place) {
          GuardedBuffer S(n * es, es), D(n * es, es);
          fill_random(t, S.data(), n, g);
          const std::vector<unsigned char> s0(S.data(), S.data() + n * es);
          void* out = in_place ? S.data() : D.data();
          scale(out, S.data(), n, t, f);
          int bad = 0;
          for (size_t i = 0; i < n && bad < 3; ++i) {
            bool ok;
            if (is_complex(t)) {
              const Cx x = complex_value(t, s0.data(), i), got = complex_value(t, out, i);
              ok = same_value(got.re, round_to(t, x.re * fm)) && same_value(got.im, round_to(t, x.im * fm));
            } else {
              ok = same_value(float_value(t, out, i), round_to(t, float_value(t, s0.data(), i) * fm));
            }
            if (!ok) {
              ++bad;
              rrtest::fail(__FILE__, __LINE__, "scale",
                           rrtest::message(dtype_name(t), " *", f, " n=", n, " i=", i, " src ",
                                           hex_bytes(t, s0.data(), i), " got ", hex_bytes(t, out, i)));
            }
          }
          RR_EXPECT(S.guards_intact() && D.guards_intact(), dtype_name(t), ": wrote outside");
        }
      }
    }
  }
}

// =============================================================================================
// copy

RR_TEST(copy_sizes_alignments_streaming) {
  // 4 KiB is where copy() starts using non-temporal stores (kStreamingMinBytes in reduce_cpu.cpp).
  const size_t T = 4 * 1024;
  const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 4095, T - 1, T, T + 1, T + 63, T + 81,
                          4 * T + 5, (size_t(1) << 20) + 3};
  const size_t max_size = *std::max_element(std::begin(sizes), std::end(sizes));
  std::vector<unsigned char> pool(max_size + 64);
  Rng g(5);
  for (auto& c : pool) c = static_cast<unsigned char>(g());
  size_t start = 0;
  for (size_t n : sizes) {
    for (bool streaming : {false, true}) {
      for (size_t soff : {0, 1, 3, 7, 32}) {
        for (size_t doff : {0, 1, 5, 13, 48}) {
          GuardedBuffer S(n, soff), D(n, doff);
          start = (start + 7) % 64;
          std::memcpy(S.data(), pool.data() + start, n);
          copy(D.data(), S.data(), n, streaming);
          RR_EXPECT(std::memcmp(D.data(), pool.data() + start, n) == 0, "n=", n, " streaming=",
                    streaming, " soff=", soff, " doff=", doff);
          RR_EXPECT(std::memcmp(S.data(), pool.data() + start, n) == 0, "source modified");
          RR_EXPECT(D.guards_intact() && S.guards_intact(), "n=", n, " streaming=", streaming,
                    " soff=", soff, " doff=", doff, ": wrote outside");
        }
      }
    }
  }
}

RR_TEST(copy_self_and_overlap) {
  std::vector<unsigned char> buf(1024, 7);
  copy(buf.data(), buf.data(), buf.size(), true);  // a no-op, not undefined
  RR_EXPECT_THROWS(copy(buf.data() + 1, buf.data(), 512), "overlap");
  copy(nullptr, nullptr, 0);
}

RR_TEST_MAIN()

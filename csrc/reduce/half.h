// IEEE binary16 (float16) and bfloat16 <-> float32 conversions, torch-free.
//
// The kernels compute fp16/bf16 in fp32 and round once, so these sit on the hot path: they are
// branch-free (the compiler turns the selects into blends and vectorises the whole loop) and use
// float arithmetic itself to do the rounding. They are bit-exact with x86 F16C (vcvtph2ps, and
// vcvtps2ph with round-to-nearest-even), NaN payloads included, so a vectorised clone and a scalar
// fallback, or one rank and another, never disagree on a bit.
//
// The fp16 tricks are those of Marat Dukhan's FP16 library (MIT licence), with one change: a NaN
// keeps its payload (and is made quiet) instead of becoming the canonical 0x7E00, as F16C does.
//
// Assumes the default rounding mode (to nearest even). Flush-to-zero / denormals-are-zero (which
// torch.set_flush_denormal turns on) do not change the results: every intermediate is a normal
// float, and the only float inputs DAZ zeroes are float subnormals, which round to a half zero
// anyway.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ringreduce {
namespace halfbits {

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// c ? x : y with both sides already computed, as masks. A plain ?: over float expressions lets GCC
// turn the select back into a branch that computes only one side, and since float ops may trap it
// will then not if-convert the loop, which stops vectorisation.
inline uint32_t select(bool c, uint32_t x, uint32_t y) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (x & m) | (y & ~m);
}

}  // namespace halfbits

inline float fp16_to_float(uint16_t h) {
  using namespace halfbits;
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // exponent and mantissa, sign shifted out

  // Normal, Inf and NaN: move the fields into float position and add 224 to the exponent, so
  // that exponent 31 (Inf/NaN) lands on 255; multiplying by 2^-112 then rebiases normals
  // (15 -> 127) while Inf and NaN stay as they are (a signalling NaN comes out quiet, like F16C).
  const float normal = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal: m * 2^-24 computed exactly as (0.5 + m * 2^-24) - 0.5, with the mantissa placed
  // below a 0.5 whose exponent makes one float ulp equal 2^-24.
  const float subnormal = float_of((two_w >> 17) | (126u << 23)) - 0.5f;

  const uint32_t mag = select(two_w < (1u << 27), bits_of(subnormal), bits_of(normal));
  return float_of(sign | mag);
}

inline uint16_t float_to_fp16(float f) {
  using namespace halfbits;
  // Scaling up then down sends everything at or above 65520 (where round-to-nearest gives Inf) to
  // Inf, and leaves the rest multiplied by 4 (the magnitude comparisons below are done on the
  // scaled value).
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;

  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  // Add a power of two whose ulp is the half ulp at f's exponent (never below the subnormal
  // ulp 2^-24): the float adder then does the round-to-nearest-even for us, and the half's
  // exponent and mantissa can be read straight out of the sum's bits.
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;

  // NaN: keep the top of the payload and set the quiet bit, as vcvtps2ph does.
  const uint32_t nan = 0x7E00u | ((w >> 13) & 0x03FFu);
  return uint16_t((sign >> 16) | select(shl1_w > 0xFF000000u, nan, nonsign));
}

inline float bf16_to_float(uint16_t h) { return halfbits::float_of(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  using namespace halfbits;
  const uint32_t w = bits_of(f);
  // Round to nearest even on the integer bits: add just under half an ulp, plus one when the
  // kept part is odd. Works unchanged for subnormals and carries into Inf on overflow.
  const uint32_t rounded = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;
  // NaN: truncate (rounding could carry the payload into the exponent) and make it quiet.
  const uint32_t nan = (w >> 16) | 0x0040u;
  return uint16_t((w & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

}  // namespace ringreduce

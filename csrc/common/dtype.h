// Element types and reduction ops as the core sees them: plain tags, no torch types.
//
// RINGREDUCE_DTYPES is the one list of what ringreduce can reduce, a row per dtype: everything
// below, the torch layer's mapping from at::ScalarType (csrc/backend/tensor_checks.cpp), its error
// that lists the supported dtypes, and the CPU and CUDA kernels' dispatch (csrc/reduce/kinds.h)
// are made from it. A dtype is added by adding its row (and a kernel kind, where none of the
// existing ones loads, computes and stores it right).
#pragma once

#include <cstddef>
#include <cstdint>

// X(tag, bytes, name, family, scalar, Kind):
// - tag: the DType enumerator; bytes: its size; name: torch's spelling;
// - family: Floating, Integral (the int and uint types, and bool) or Complex;
// - scalar: the c10::ScalarType enumerator it is in torch;
// - Kind: the kernels' element kind (csrc/reduce/): how an element is loaded, computed on (float16
//   and bfloat16 in fp32, complex as two reals) and stored.
#define RINGREDUCE_DTYPES(X)                                                    \
  X(Float32, 4, "float32", Floating, Float, Native<float>)                     \
  X(Float64, 8, "float64", Floating, Double, Native<double>)                   \
  X(Float16, 2, "float16", Floating, Half, Half)                               \
  X(BFloat16, 2, "bfloat16", Floating, BFloat16, BHalf)                        \
  X(Int8, 1, "int8", Integral, Char, Native<int8_t>)                           \
  X(UInt8, 1, "uint8", Integral, Byte, Native<uint8_t>)                        \
  X(Int16, 2, "int16", Integral, Short, Native<int16_t>)                       \
  X(Int32, 4, "int32", Integral, Int, Native<int32_t>)                         \
  X(Int64, 8, "int64", Integral, Long, Native<int64_t>)                        \
  X(Bool, 1, "bool", Integral, Bool, Bool)                                     \
  X(Complex64, 8, "complex64", Complex, ComplexFloat, Native<Complex<float>>)  \
  X(Complex128, 16, "complex128", Complex, ComplexDouble, Native<Complex<double>>)

namespace ringreduce {

enum class DType : uint8_t {
#define RINGREDUCE_DTYPE_TAG(tag, bytes, name, family, scalar, Kind) tag,
  RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_TAG)
#undef RINGREDUCE_DTYPE_TAG
};

// AVG and PREMUL_SUM are not kernels of their own: AVG is a SUM followed by divide(), and
// PREMUL_SUM scales each rank's input before a SUM (see csrc/backend/).
enum class RedOp : uint8_t { Sum, Prod, Min, Max, BAnd, BOr, BXor };

// Every dtype in the list's order, and every op: what the tests sweep.
constexpr DType kAllDTypes[] = {
#define RINGREDUCE_DTYPE_TAG(tag, bytes, name, family, scalar, Kind) DType::tag,
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_TAG)
#undef RINGREDUCE_DTYPE_TAG
};
constexpr RedOp kAllRedOps[] = {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max,
                                RedOp::BAnd, RedOp::BOr, RedOp::BXor};

// Throws ringreduce::Error for a tag outside the list.
[[noreturn]] void throw_unknown_dtype(DType t);
// Inline: the kernels and the algorithms ask for it several times per op.
inline size_t dtype_size(DType t) {
  switch (t) {
#define RINGREDUCE_DTYPE_SIZE(tag, bytes, name, family, scalar, Kind) \
  case DType::tag:                                                     \
    return bytes;
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_SIZE)
#undef RINGREDUCE_DTYPE_SIZE
  }
  throw_unknown_dtype(t);
}
const char* dtype_name(DType t);  // "float32", "bfloat16", ... (torch's spelling)
const char* redop_name(RedOp op); // "sum", "product", "min", "max", "band", "bor", "bxor"
bool is_floating(DType t);        // float32/64, float16, bfloat16
bool is_complex(DType t);
bool is_integral(DType t);        // the int and uint types, and bool
// "float32, float64, ..., complex128": every dtype's name, for errors that list them.
const char* supported_dtypes();

// nullptr when `op` is defined on `t`; otherwise a sentence saying why not, e.g.
// "min is not defined on complex numbers" or "bitwise ops need an integer or bool tensor".
const char* unsupported_reason(DType t, RedOp op);

}  // namespace ringreduce

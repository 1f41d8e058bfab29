// Element types and reduction ops as the core sees them: plain tags, no torch types.
//
// This is the one list of what ringreduce can reduce. The torch layer maps at::ScalarType and
// c10d::ReduceOp onto these tags (csrc/backend/), and the CPU and CUDA kernels dispatch on them
// from one list (csrc/reduce/kinds.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ringreduce {

enum class DType : uint8_t {
  Float32,
  Float64,
  Float16,   // IEEE half: arithmetic in fp32
  BFloat16,  // arithmetic in fp32
  Int8,
  UInt8,
  Int16,
  Int32,
  Int64,
  Bool,
  Complex64,   // two float32
  Complex128,  // two float64
};

// AVG and PREMUL_SUM are not kernels of their own: AVG is a SUM followed by divide(), and
// PREMUL_SUM scales each rank's input before a SUM (see csrc/backend/).
enum class RedOp : uint8_t { Sum, Prod, Min, Max, BAnd, BOr, BXor };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "float32", "bfloat16", ... (torch's spelling)
const char* redop_name(RedOp op); // "sum", "product", "min", "max", "band", "bor", "bxor"
bool is_floating(DType t);        // float32/64, float16, bfloat16
bool is_complex(DType t);
bool is_integral(DType t);        // the int and uint types, and bool

// nullptr when `op` is defined on `t`; otherwise a sentence saying why not, e.g.
// "min is not defined on complex numbers" or "bitwise ops need an integer or bool tensor".
const char* unsupported_reason(DType t, RedOp op);

}  // namespace ringreduce

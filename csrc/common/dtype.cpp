#include "common/dtype.h"

#include "common/error.h"

namespace ringreduce {

// Unknown tags can only come from a corrupted header or a cast from an unchecked integer (the
// torch layer maps known types only), so size and predicates throw or say "no", and names return a
// placeholder: they are used while building error messages and must not throw from there.

size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Float16: return 2;
    case DType::BFloat16: return 2;
    case DType::Int8: return 1;
    case DType::UInt8: return 1;
    case DType::Int16: return 2;
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Bool: return 1;
    case DType::Complex64: return 8;
    case DType::Complex128: return 16;
  }
  throw Error(detail::cat("ringreduce: unknown dtype tag ", static_cast<unsigned>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int16: return "int16";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Bool: return "bool";
    case DType::Complex64: return "complex64";
    case DType::Complex128: return "complex128";
  }
  return "<unknown dtype>";
}

const char* redop_name(RedOp op) {
  switch (op) {
    case RedOp::Sum: return "sum";
    case RedOp::Prod: return "product";
    case RedOp::Min: return "min";
    case RedOp::Max: return "max";
    case RedOp::BAnd: return "band";
    case RedOp::BOr: return "bor";
    case RedOp::BXor: return "bxor";
  }
  return "<unknown op>";
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 ||
         t == DType::BFloat16;
}

bool is_complex(DType t) { return t == DType::Complex64 || t == DType::Complex128; }

bool is_integral(DType t) {
  switch (t) {
    case DType::Int8:
    case DType::UInt8:
    case DType::Int16:
    case DType::Int32:
    case DType::Int64:
    case DType::Bool:
      return true;
    default:
      return false;
  }
}

const char* unsupported_reason(DType t, RedOp op) {
  // An unknown tag is "not defined" either: answering nullptr would send it on to the kernels.
  if (!is_floating(t) && !is_complex(t) && !is_integral(t)) return "unknown dtype tag";
  switch (op) {
    case RedOp::Sum:
    case RedOp::Prod:
      // Defined on every type; on bool torch computes them as logical or / logical and.
      return nullptr;
    case RedOp::Min:
      return is_complex(t) ? "min is not defined on complex numbers" : nullptr;
    case RedOp::Max:
      return is_complex(t) ? "max is not defined on complex numbers" : nullptr;
    case RedOp::BAnd:
    case RedOp::BOr:
    case RedOp::BXor:
      return is_integral(t) ? nullptr : "bitwise ops need an integer or bool tensor";
  }
  return "unknown op tag";
}

}  // namespace ringreduce

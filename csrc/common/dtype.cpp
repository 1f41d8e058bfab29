#include "common/dtype.h"

#include <string>

#include "common/error.h"

namespace ringreduce {

// Unknown tags can only come from a corrupted header or a cast from an unchecked integer (the
// torch layer maps known types only), so size and predicates throw or say "no", and names return a
// placeholder: they are used while building error messages and must not throw from there.

void throw_unknown_dtype(DType t) {
  throw Error(detail::cat("ringreduce: unknown dtype tag ", static_cast<unsigned>(t)));
}

const char* dtype_name(DType t) {
  switch (t) {
#define RINGREDUCE_DTYPE_NAME(tag, bytes, name, family, scalar, Kind) \
  case DType::tag:                                                     \
    return name;
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_NAME)
#undef RINGREDUCE_DTYPE_NAME
  }
  return "<unknown dtype>";
}

const char* supported_dtypes() {
  static const std::string names = [] {
    std::string s;
#define RINGREDUCE_DTYPE_LIST(tag, bytes, name, family, scalar, Kind) s += (s.empty() ? "" : ", ") + std::string(name);
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_LIST)
#undef RINGREDUCE_DTYPE_LIST
    return s;
  }();
  return names.c_str();
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

namespace {

enum class Family { None, Floating, Integral, Complex };

Family family_of(DType t) {
  switch (t) {
#define RINGREDUCE_DTYPE_FAMILY(tag, bytes, name, family, scalar, Kind) \
  case DType::tag:                                                       \
    return Family::family;
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_FAMILY)
#undef RINGREDUCE_DTYPE_FAMILY
  }
  return Family::None;
}

}  // namespace

bool is_floating(DType t) { return family_of(t) == Family::Floating; }
bool is_complex(DType t) { return family_of(t) == Family::Complex; }
bool is_integral(DType t) { return family_of(t) == Family::Integral; }

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

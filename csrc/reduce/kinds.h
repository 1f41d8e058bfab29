// Which element kind and which op functor each dtype and op tag dispatches to, shared by the CPU
// kernels (reduce_cpu.cpp) and the CUDA kernels (reduce_cuda.cu). The kinds are named in
// common/dtype.h's row of each dtype; the op functors are listed here. Each kernel file defines
// its own kinds (Native<T>, Half, BHalf, Bool: how an element is loaded, computed on and stored)
// and its floating-point primitives (`Arith`), and builds its dispatch switch from these lists, so
// the two can never map a tag to different kinds.
#pragma once

#include "common/dtype.h"

// X(RedOp tag, op functor): the functor of each reduction op (reduce/ops.h), where the file
// that expands it names its floating-point primitives `Arith`.
#define RINGREDUCE_REDUCE_OPS(X) \
  X(Sum, ops::Sum<Arith>)        \
  X(Prod, ops::Prod<Arith>)      \
  X(Min, ops::Min)               \
  X(Max, ops::Max)               \
  X(BAnd, ops::BAnd)             \
  X(BOr, ops::BOr)               \
  X(BXor, ops::BXor)

// The cases of a switch over DType (RedOp) that call f with the tag's kind (op functor), in a
// function whose callable is named `f`.
#define RINGREDUCE_KIND_CASE(tag, bytes, name, family, scalar, Kind) \
  case DType::tag:                                                    \
    return f(Kind{});
#define RINGREDUCE_OP_CASE(tag, Op) \
  case RedOp::tag:                  \
    return f(Op{});

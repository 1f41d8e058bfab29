// The one list of which element kind and which op functor each dtype and op tag dispatches to,
// shared by the CPU kernels (reduce_cpu.cpp) and the CUDA kernels (reduce_cuda.cu). Each of them
// defines its own kinds (Native<T>, Half, BHalf, Bool, Complex<R>: how an element is loaded,
// computed on and stored) and op functors (OpSum, ...), and builds its dispatch switch from these
// lists, so a dtype or an op added to common/dtype.h is added here once and reaches both, and
// the two can never map a tag to different kinds.
#pragma once

// X(DType tag, kind type): the kernel kind of each dtype.
#define RINGREDUCE_REDUCE_KINDS(X) \
  X(Float32, Native<float>)        \
  X(Float64, Native<double>)       \
  X(Float16, Half)                 \
  X(BFloat16, BHalf)               \
  X(Int8, Native<int8_t>)          \
  X(UInt8, Native<uint8_t>)        \
  X(Int16, Native<int16_t>)        \
  X(Int32, Native<int32_t>)        \
  X(Int64, Native<int64_t>)        \
  X(Bool, Bool)                    \
  X(Complex64, Native<Complex<float>>) \
  X(Complex128, Native<Complex<double>>)

// X(RedOp tag, op functor): the functor of each reduction op.
#define RINGREDUCE_REDUCE_OPS(X) \
  X(Sum, OpSum)                  \
  X(Prod, OpProd)                \
  X(Min, OpMin)                  \
  X(Max, OpMax)                  \
  X(BAnd, OpBAnd)                \
  X(BOr, OpBOr)                  \
  X(BXor, OpBXor)

// The cases of a switch over DType (RedOp) that call f with the tag's kind (op functor), in a
// function whose callable is named `f`.
#define RINGREDUCE_KIND_CASE(tag, Kind) \
  case DType::tag:                      \
    return f(Kind{});
#define RINGREDUCE_OP_CASE(tag, Op) \
  case RedOp::tag:                  \
    return f(Op{});

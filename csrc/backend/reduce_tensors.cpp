// reduce_tensors(): ringreduce's kernels on tensors, for tests and the kernel benchmark.
#include "backend/ring_backend.h"

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#ifdef RINGREDUCE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "reduce/reduce_cuda.h"
#endif
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "reduce/reduce.h"

namespace ringreduce {

void reduce_tensors(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                    const std::string& op) {
  const char* name = "reduce_tensors";
  auto check = [&](const at::Tensor& t, const char* what) {
    if (!t.defined() || !t.is_contiguous() || t.device() != dst.device() ||
        t.scalar_type() != dst.scalar_type() || t.numel() != dst.numel()) {
      fail(detail::cat("ringreduce ", name, ": ", what, " must be a contiguous tensor shaped like dst (",
                       dst.numel(), " elements of ", dst.scalar_type(), " on ", dst.device(), ")"));
    }
  };
  check(dst, "dst");
  check(a, "a");
  check(b, "b");
  const auto d = core_dtype(dst.scalar_type());
  if (!d) fail(detail::cat("ringreduce ", name, ": dtype ", dst.scalar_type(), " is not supported"));
  static const std::pair<const char*, RedOp> kOps[] = {
      {"sum", RedOp::Sum}, {"product", RedOp::Prod}, {"min", RedOp::Min}, {"max", RedOp::Max},
      {"band", RedOp::BAnd}, {"bor", RedOp::BOr}, {"bxor", RedOp::BXor}};
  std::optional<RedOp> rop;
  for (const auto& [n, o] : kOps) {
    if (op == n) rop = o;
  }
  if (!rop) fail(detail::cat("ringreduce ", name, ": unknown op '", op, "'"));
  try {
    const auto n = static_cast<size_t>(dst.numel());
    if (dst.is_cpu()) {
      reduce(dst.data_ptr(), a.data_ptr(), b.data_ptr(), n, *d, *rop);
      return;
    }
#ifdef RINGREDUCE_WITH_CUDA
    if (dst.is_cuda()) {
      c10::cuda::CUDAGuard guard(dst.device());
      cuda::reduce(dst.data_ptr(), a.data_ptr(), b.data_ptr(), n, *d, *rop,
                   c10::cuda::getCurrentCUDAStream(dst.device().index()).stream());
      return;
    }
#endif
  } catch (const std::exception& e) {
    fail(detail::cat("ringreduce ", name, ": ", e.what()));
  }
  fail(detail::cat("ringreduce ", name, ": tensors on ", dst.device(), " are not supported by this build"));
}

}  // namespace ringreduce

#include "backend/tensor_checks.h"

#include <c10/util/Exception.h>

#include "common/error.h"

namespace ringreduce {

void fail(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

std::optional<DType> core_dtype(at::ScalarType s) {
  switch (s) {
#define RINGREDUCE_DTYPE_OF_SCALAR(tag, bytes, name, family, scalar, Kind) \
  case at::ScalarType::scalar:                                             \
    return DType::tag;
    RINGREDUCE_DTYPES(RINGREDUCE_DTYPE_OF_SCALAR)
#undef RINGREDUCE_DTYPE_OF_SCALAR
    default: return std::nullopt;
  }
}

at::Tensor single_tensor(const std::vector<at::Tensor>& tensors, const char* op, int rank) {
  if (tensors.size() != 1) {
    fail(detail::cat(op_prefix(op, rank), "expected exactly one tensor, got ",
                     tensors.size(), " (ringreduce runs one device per rank)"));
  }
  const at::Tensor& t = tensors[0];
  if (!t.defined()) fail(detail::cat(op_prefix(op, rank), "the tensor is undefined"));
  if (t.layout() != at::kStrided) {
    fail(detail::cat(op_prefix(op, rank), t.layout(),
                     " tensors are not supported, only dense (strided) ones"));
  }
  if (!t.device().is_cpu() && !(kWithCuda && t.device().is_cuda())) {
    fail(detail::cat(op_prefix(op, rank), "got a tensor on ", t.device(),
                     "; ringreduce handles CPU", kWithCuda ? " and CUDA" : "", " tensors only",
                     kWithCuda ? "" : detail::cat(" (", cuda_build_note(), ")")));
  }
  return t;
}

DType checked_dtype(const at::Tensor& t, const char* op, int rank) {
  const auto d = core_dtype(t.scalar_type());
  if (!d) {
    fail(detail::cat(op_prefix(op, rank), "dtype ", t.scalar_type(),
                     " is not supported (supported: ", supported_dtypes(), ")"));
  }
  return *d;
}

Reduction checked_reduction(const c10d::ReduceOp& rop, DType d, const char* op, int rank, int size) {
  Reduction r;
  switch (rop.op_) {
    case c10d::ReduceOp::SUM: r.op = RedOp::Sum; break;
    case c10d::ReduceOp::PRODUCT: r.op = RedOp::Prod; break;
    case c10d::ReduceOp::MIN: r.op = RedOp::Min; break;
    case c10d::ReduceOp::MAX: r.op = RedOp::Max; break;
    case c10d::ReduceOp::BAND: r.op = RedOp::BAnd; break;
    case c10d::ReduceOp::BOR: r.op = RedOp::BOr; break;
    case c10d::ReduceOp::BXOR: r.op = RedOp::BXor; break;
    case c10d::ReduceOp::AVG:
      if (d == DType::Bool) {
        fail(detail::cat(op_prefix(op, rank), "AVG is not defined on bool tensors"));
      }
      r.divisor = size;
      break;
    case c10d::ReduceOp::PREMUL_SUM: {
      if (!is_floating(d) && !is_complex(d)) {
        fail(detail::cat(op_prefix(op, rank), "PREMUL_SUM needs a floating-point ",
                         "or complex tensor, got ", dtype_name(d)));
      }
      // NCCLPreMulSumSupplement: the name both torch 2.11 and 2.13 have (2.13 calls it PreMulSumSupplement too).
      const auto* supp = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      if (supp == nullptr) {
        fail(detail::cat(op_prefix(op, rank),
                         "PREMUL_SUM without a factor (make it with _make_nccl_premul_sum)"));
      }
      if (supp->tensor_factor.defined()) {
        if (supp->tensor_factor.numel() != 1) {
          fail(detail::cat(op_prefix(op, rank), "PREMUL_SUM's factor tensor has ",
                           supp->tensor_factor.numel(), " elements, expected 1"));
        }
        r.premul = supp->tensor_factor.to(at::kCPU).item<double>();
      } else {
        r.premul = supp->double_factor;
      }
      break;
    }
    default:
      fail(detail::cat(op_prefix(op, rank), "reduce op ", static_cast<int>(rop.op_),
                       " is not supported"));
  }
  if (const char* why = unsupported_reason(d, r.op)) {
    fail(detail::cat(op_prefix(op, rank), redop_name(r.op), " on ",
                     dtype_name(d), ": ", why));
  }
  return r;
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, int rank,
                      const char* what) {
  if (a.scalar_type() != b.scalar_type()) {
    fail(detail::cat(op_prefix(op, rank), what, " has dtype ", a.scalar_type(),
                     ", expected ", b.scalar_type(), " like the input"));
  }
}

void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int n, const char* op,
                int rank, const char* what) {
  if (static_cast<int>(list.size()) != n) {
    fail(detail::cat(op_prefix(op, rank), "the ", what, " list has ", list.size(),
                     " tensors, expected one per rank (", n, ")"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    single_tensor({list[i]}, op, rank);
    check_same_dtype(list[i], like, op, rank, what);
    if (list[i].numel() != like.numel()) {
      fail(detail::cat(op_prefix(op, rank), what, " tensor ", i, " has ",
                       list[i].numel(), " elements, expected ", like.numel()));
    }
  }
}

void check_pairs(size_t outputs, size_t inputs, const char* op, int rank) {
  if (outputs != inputs) {
    fail(detail::cat(op_prefix(op, rank), outputs, " outputs for ", inputs,
                     " inputs"));
  }
}

void check_peer(int peer, int rank, int size, const char* op, const char* what) {
  if (peer < 0 || peer >= size) {
    fail(detail::cat(op_prefix(op, rank), "invalid ", what, " rank ", peer,
                     " (group of ", size, ")"));
  }
  if (peer == rank) {
    fail(detail::cat(op_prefix(op, rank), what, " rank ", peer,
                     " is this rank itself"));
  }
}

int checked_root(int64_t root, const char* op, int rank, int size) {
  if (root < 0 || root >= size) {
    fail(detail::cat(op_prefix(op, rank), "root ", root,
                     " is not a rank of this group (size ", size, ")"));
  }
  return static_cast<int>(root);
}

std::pair<DType, Reduction> checked_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& rop, int rank, int size) {
  const char* name = "reduce_scatter";
  single_tensor({output}, name, rank);
  single_tensor({input}, name, rank);
  check_same_dtype(output, input, name, rank, "the output");
  const DType d = checked_dtype(input, name, rank);
  const Reduction red = checked_reduction(rop, d, name, rank, size);
  if (input.numel() != output.numel() * size) {
    fail(detail::cat(op_prefix("reduce_scatter", rank), "the input has ", input.numel(),
                     " elements, expected world size (", size, ") x the output's ", output.numel()));
  }
  return {d, red};
}

void check_allgather(const at::Tensor& output, const at::Tensor& input, int rank, int size) {
  const char* name = "allgather";
  single_tensor({output}, name, rank);
  single_tensor({input}, name, rank);
  check_same_dtype(output, input, name, rank, "the output");
  if (output.numel() != input.numel() * size) {
    fail(detail::cat(op_prefix("allgather", rank), "the output has ", output.numel(),
                     " elements, expected world size (", size, ") x the input's ", input.numel()));
  }
}

std::optional<c10::Device> checked_device(const char* op, int rank,
                                          const std::vector<at::Tensor>& outputs,
                                          const std::vector<at::Tensor>& inputs) {
  std::optional<c10::Device> device;
  for (const std::vector<at::Tensor>* list : {&outputs, &inputs}) {
    for (const at::Tensor& t : *list) {
      if (!t.defined()) continue;
      if (!device) {
        device = t.device();
      } else if (t.device() != *device) {
        fail(detail::cat(op_prefix(op, rank), "the op's tensors are on ",
                         *device, " and ", t.device(), "; they must all be on one device"));
      }
    }
  }
  if (!kWithCuda && device && device->is_cuda()) {
    fail(detail::cat(op_prefix(op, rank), "got a tensor on ", *device,
                     "; this build of ringreduce handles CPU tensors only (", cuda_build_note(), ")"));
  }
  return device;
}

}  // namespace ringreduce

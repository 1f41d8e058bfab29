// Direct ops for inference loops: torch.ops.ringreduce.all_reduce_ and all_gather_into_tensor_.
//
// Tensor-parallel decode all-reduces a few KiB per layer per token, where the Python wrapper of
// dist.all_reduce (about 4 us) costs more than the exchange. These ops reach the group's backend
// from one dispatcher call, as DeepSpeed's inference_all_reduce_ and vLLM's shm_allreduce do,
// and run the backend's own entry points: the same checks, errors, sequence numbers, flight
// recorder, deadlines and bits as dist.all_reduce on the same group, so the two may be mixed on
// one group (a rank that calls one where its peers call another op fails as any desync does).
//
// The all-reduce of one dense contiguous CPU tensor on an idle group runs where it is called,
// with no Work (RingBackend::allreduce_now): what the op costs beside its exchange is then the
// checks, the sequence number and the flight record.
//
// They mutate their first argument and return nothing, with Meta kernels, so torch.compile traces
// them into a graph without a break (a mutating op that returned an alias would not trace).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <string>

#include "algo/collectives.h"
#include "backend/direct_ops.h"
#include "backend/ring_backend.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/log.h"

namespace ringreduce {

namespace {

// torch names the default group "0" (distributed_c10d._process_group_name, reset when the default
// group is destroyed); the Python wrappers pass the group's own name.
constexpr const char* kDefaultGroup = "0";

RingBackend& backend_of(c10::string_view group, const char* op) {
  const std::string name = group.empty() ? std::string(kDefaultGroup) : std::string(group);
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception&) {
    TORCH_CHECK(false, "ringreduce ", op, ": there is no process group named '", name,
                "' (pass a group's group_name, or '' for the default group, once "
                "init_process_group has run)");
  }
  c10::intrusive_ptr<c10d::Backend> b;
  try {
    b = pg->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception&) {
    TORCH_CHECK(false, "ringreduce ", op, ": process group '", name, "' has no backend for CPU tensors");
  }
  auto* rb = dynamic_cast<RingBackend*>(b.get());
  TORCH_CHECK(rb != nullptr, "ringreduce ", op, ": process group '", name, "' uses the ",
              b->getBackendName(), " backend for CPU tensors, not ringreduce");
  return *rb;
}

c10d::ReduceOp reduce_op(c10::string_view text, int rank) {
  const std::string s(text);
  if (s == "sum") return c10d::ReduceOp::SUM;
  if (s == "avg") return c10d::ReduceOp::AVG;
  if (s == "product" || s == "prod") return c10d::ReduceOp::PRODUCT;
  if (s == "min") return c10d::ReduceOp::MIN;
  if (s == "max") return c10d::ReduceOp::MAX;
  if (s == "band") return c10d::ReduceOp::BAND;
  if (s == "bor") return c10d::ReduceOp::BOR;
  if (s == "bxor") return c10d::ReduceOp::BXOR;
  TORCH_CHECK(false, "ringreduce all_reduce_: rank ", rank, ": op '", s,
              "' is not one of sum, avg, product, min, max, band, bor, bxor");
}

void all_reduce_cpu(at::Tensor t, c10::string_view op, c10::string_view group) {
  RingBackend& b = backend_of(group, "all_reduce_");
  c10d::AllreduceOptions opts;
  opts.reduceOp = reduce_op(op, b.getRank());
  opts.asyncOp = false;  // the caller waits at once: run it on this thread when the queue is free
  // dist.all_reduce hands a complex SUM or AVG to the backend as its real view, which the ring
  // cuts into chunks at other places: the same here, so the two paths give the same bits.
  const bool as_real = t.is_complex() && (opts.reduceOp == c10d::ReduceOp::SUM ||
                                          opts.reduceOp == c10d::ReduceOp::AVG);
  b.allreduce_now(as_real ? at::view_as_real(t) : t, opts);
}

void all_gather_into_tensor_cpu(at::Tensor out, const at::Tensor& in, c10::string_view group) {
  RingBackend& b = backend_of(group, "all_gather_into_tensor_");
  at::Tensor input = in;
  c10d::AllgatherOptions opts;
  opts.asyncOp = false;
  b._allgather_base(out, input, opts)->wait();
}

void all_reduce_meta(at::Tensor, c10::string_view, c10::string_view) {}
void all_gather_into_tensor_meta(at::Tensor, const at::Tensor&, c10::string_view) {}

// The Autograd kernels. The ops are not differentiable; what an in-place op owes autograd is the
// version bump of the tensor it writes, so that a backward that saved it refuses to run on what
// the op wrote over. Without these, each call went through torch's boxed autograd fallback, which
// bumps nothing and cost 0.11 us of the 0.37 us an all-reduce takes at world size 1.
template <class... Args>
void below_autograd(const c10::TypedOperatorHandle<void(at::Tensor, Args...)>& op, at::Tensor written,
                    Args... args) {
  {
    at::AutoDispatchBelowADInplaceOrView below;
    op.call(written, args...);
  }
  if (!written.is_inference()) torch::autograd::impl::bump_version(written);
}

void all_reduce_autograd(at::Tensor t, c10::string_view op, c10::string_view group) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("ringreduce::all_reduce_", "")
                                 .typed<void(at::Tensor, c10::string_view, c10::string_view)>();
  below_autograd(handle, t, op, group);
}

void all_gather_into_tensor_autograd(at::Tensor out, const at::Tensor& in, c10::string_view group) {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("ringreduce::all_gather_into_tensor_", "")
                                 .typed<void(at::Tensor, const at::Tensor&, c10::string_view)>();
  below_autograd<const at::Tensor&, c10::string_view>(handle, out, in, group);
}

}  // namespace

// What an inference loop passes, one dense contiguous CPU tensor reduced in place on an idle group,
// runs here with no Work (allreduce_inline); anything else takes allreduce() and waits.
void RingBackend::allreduce_now(const at::Tensor& t, const c10d::AllreduceOptions& opts) {
  const char* name = "allreduce";
  if (dense_cpu(t)) {
    const DType d = checked_dtype(t, name, rank_);
    const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
    if (!red.premul && allreduce_inline(t, d, red, opts.timeout)) return;
  }
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions sync = opts;
  sync.asyncOp = false;
  allreduce(ts, sync)->wait();
}

double time_all_reduce(at::Tensor t, int64_t iters, const std::string& group) {
  TORCH_CHECK(iters >= 0, "ringreduce time_all_reduce: iters must be >= 0, got ", iters);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("ringreduce::all_reduce_", "")
                             .typed<void(at::Tensor, c10::string_view, c10::string_view)>();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) op.call(t, "sum", group);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double time_backend_all_reduce(at::Tensor t, int64_t iters, const std::string& group, bool async_op) {
  TORCH_CHECK(iters >= 0, "ringreduce time_backend_all_reduce: iters must be >= 0, got ", iters);
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(group.empty() ? std::string(kDefaultGroup) : group);
  } catch (const std::exception&) {
    TORCH_CHECK(false, "ringreduce time_backend_all_reduce: there is no process group named '", group, "'");
  }
  const c10::intrusive_ptr<c10d::Backend> b = pg->getBackend(t.device().type());
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions opts;
  opts.asyncOp = async_op;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) b->allreduce(ts, opts)->wait();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace ringreduce

TORCH_LIBRARY(ringreduce, m) {
  m.def("all_reduce_(Tensor(a!) t, str op, str group) -> ()");
  m.def("all_gather_into_tensor_(Tensor(a!) out, Tensor input, str group) -> ()");
}

TORCH_LIBRARY_IMPL(ringreduce, CPU, m) {
  m.impl("all_reduce_", &ringreduce::all_reduce_cpu);
  m.impl("all_gather_into_tensor_", &ringreduce::all_gather_into_tensor_cpu);
}

TORCH_LIBRARY_IMPL(ringreduce, Autograd, m) {
  m.impl("all_reduce_", &ringreduce::all_reduce_autograd);
  m.impl("all_gather_into_tensor_", &ringreduce::all_gather_into_tensor_autograd);
}

TORCH_LIBRARY_IMPL(ringreduce, Meta, m) {
  m.impl("all_reduce_", &ringreduce::all_reduce_meta);
  m.impl("all_gather_into_tensor_", &ringreduce::all_gather_into_tensor_meta);
}

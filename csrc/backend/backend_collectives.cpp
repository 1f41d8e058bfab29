// The collectives of RingBackend: each c10d entry point checks its arguments (tensor_checks.h),
// builds the op (what runs once its turn comes, over the buffers it owns) and queues it.
#include "backend/ring_backend.h"

#ifdef RINGREDUCE_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "algo/collectives.h"
#include "backend/monitored_barrier.h"
#include "backend/sparse.h"
#include "backend/storage_pins.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/links.h"
#include "transport/wait.h"

namespace ringreduce {

namespace {

// A tensor the op may write for the caller's `t`: t itself when it is contiguous and clear of
// `input`, else a private buffer (owned by the op) copied into t only on success.
at::Tensor writable(const at::Tensor& t, const at::Tensor& input) {
  if (t.is_contiguous() && at::get_overlap_status(t, input) == at::MemOverlapStatus::No) return t;
  return at::empty(t.sizes(), t.options());
}

// Ops that only move bytes take any dtype: types the kernels do not know travel as bytes. Returns
// the tag to move `t` as, and how many of those elements one of t's elements is.
std::pair<DType, size_t> moved_as(const at::Tensor& t) {
  const auto known = core_dtype(t.scalar_type());
  if (known) return {*known, 1};
  return {DType::UInt8, t.element_size()};
}

std::pair<DType, size_t> as_moved(const at::Tensor& t) {
  const auto [d, scale] = moved_as(t);
  return {d, static_cast<size_t>(t.numel()) * scale};
}

// The caller's tensors, or private contiguous buffers (owned by the op, copied back on success)
// where a caller's tensor is strided.
std::vector<at::Tensor> writable_list(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(t.is_contiguous() ? t : at::empty(t.sizes(), t.options()));
  return out;
}

void copy_back(const std::vector<at::Tensor>& bufs, const std::vector<at::Tensor>& user) {
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (!bufs[i].is_same(user[i])) user[i].copy_(bufs[i]);
  }
}

std::vector<void*> pointers(const std::vector<at::Tensor>& ts) {
  std::vector<void*> p;
  for (const at::Tensor& t : ts) p.push_back(t.data_ptr());
  return p;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce(std::vector<at::Tensor>& tensors_arg,
                                                      const c10d::AllreduceOptions& opts) {
  if (tensors_arg.size() == 1 && tensors_arg[0].defined() && tensors_arg[0].is_sparse()) {
    // The result replaces the caller's tensor's indices and values: its own TensorImpl, not held.
    const at::Tensor& t = tensors_arg[0];
    // sparse_allreduce_body checks the tensor: sparse COO, on the CPU, reduced with SUM.
    Body body = sparse_allreduce_body(t, opts.reduceOp, rank_, size_);
    return enqueue(c10d::OpType::ALLREDUCE, "allreduce", t.device(), {t}, {}, opts.timeout,
                   opts.asyncOp, std::move(body));
  }
  const char* name = "allreduce";
  if (tensors_arg.size() == 1 && opts.reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM &&
      dense_cpu(tensors_arg[0])) {
    // One dense contiguous CPU tensor, the call of a plain dist.all_reduce, of its async form and
    // of the functional collectives. (PREMUL_SUM takes the path below: its factor is checked once.)
    const at::Tensor& t = tensors_arg[0];
    const DType d = checked_dtype(t, name, rank_);
    const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
    uint64_t seq = 0;
    std::exception_ptr error;
    // The caller waits at once, or the group is this rank alone (where an async op runs at its
    // call too, see enqueue()): on an idle group it runs here (allreduce_inline), and its Work is
    // made complete, carrying the op's error for wait() as enqueue()'s inline run does. It needs
    // no tensors of its own and no storage pins, which only an op still running after its call
    // does.
    if ((!opts.asyncOp || size_ == 1) && allreduce_inline(t, d, red, opts.timeout, &seq, &error)) {
      // A synchronous op's Work refers to the caller's tensor without owning it (see
      // RingWork::refer_to): dist.all_reduce drops it at once, and owning the tensor cost a round
      // trip of the GIL when it did. An async one (in a group of one) keeps its tensor.
      auto work = c10::make_intrusive<RingWork>(rank_, c10d::OpType::ALLREDUCE, name, seq,
                                                opts.asyncOp ? std::vector<at::Tensor>{t}
                                                             : std::vector<at::Tensor>{},
                                                queue_.state());
      if (!opts.asyncOp) work->refer_to(t);
      work->complete_unshared(error);
      return work;
    }
    // Queued (async, or a busy group). An async op works in place in the storage the tensor has
    // now, which its pins keep from growing (enqueue pins the caller's tensor): it needs no
    // tensor of its own (held()) to be safe from a set_ before wait().
    return enqueue(c10d::OpType::ALLREDUCE, name, t.device(), {t}, {}, opts.timeout, opts.asyncOp,
                   opts.asyncOp ? pinned_allreduce_body(t, d, red) : allreduce_body(t, d, red));
  }
  const auto tensors = held(tensors_arg, opts.asyncOp);
  at::Tensor t = single_tensor(tensors, name, rank_);
  const DType d = checked_dtype(t, name, rank_);
  const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
  const auto device = checked_device(name, rank_, {t}, {});
#ifdef RINGREDUCE_WITH_CUDA
  if (device && device->is_cuda() && cuda_->takes_ordered_allreduce(name, *device, red.op, red.divisor)) {
    return ordered_allreduce(t, d, red, opts.timeout);
  }
#endif
  return enqueue(c10d::OpType::ALLREDUCE, name, device, {t}, {}, opts.timeout, opts.asyncOp,
                 allreduce_body(t, d, red));
}

#ifdef RINGREDUCE_WITH_CUDA
// A stream-ordered CUDA all-reduce (backend/cuda_ordered.h): queued here, on the caller's thread.
c10::intrusive_ptr<c10d::Work> RingBackend::ordered_allreduce(const at::Tensor& t, DType d,
                                                             const Reduction& red,
                                                             std::chrono::milliseconds timeout) {
  const char* name = "allreduce";
  at::NoGradGuard no_grad;
  // The group's stream runs ops in call order: ops queued before this one for the progress
  // thread (ring ops, host ops) run first, here.
  queue_.finish_queued();
  // A strided tensor is reduced in a contiguous copy and written back on the op's stream (where
  // an aborted op leaves the copy, and so the tensor, as it was); PREMUL_SUM scales this rank's
  // contribution into a tensor of the op's own. Both on the caller's stream, before the op.
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  at::Tensor in = red.premul ? buf.mul(*red.premul) : buf;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t seq = next_seq_++;
  const std::chrono::milliseconds limit = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  const bool recorded = flight_->capacity() != 0;
  if (recorded) {
    flight_->issued_running(seq, name, shapes_of(t), c10::toString(t.scalar_type()), Clock::now());
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = cuda_->ordered_allreduce(name, seq, in, buf, t, d, red.op, limit);
  } catch (...) {
    --next_seq_;  // never issued: later ops keep the numbers the other ranks give them
    if (recorded) flight_->withdraw(seq);
    throw;
  }
  if (!buf.is_same(t)) {
    // On the op's stream: wait() orders the caller after it as after the op.
    c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(t.device().index());
    work->synchronize();
    t.copy_(buf);
    buf.record_stream(caller);
  }
  return work;
}
#endif

RingBackend::Body RingBackend::pinned_allreduce_body(const at::Tensor& t, DType d, const Reduction& red) {
  // Its storage and its place in it, taken at the call: a set_ of the caller's tensor before
  // wait() changes neither. The address is read from the storage when the op runs, as torch may
  // move a storage's memory in place (share_memory_, which no pin prevents) while the op waits.
  c10::Storage storage = t.storage();
  const size_t offset = static_cast<size_t>(t.storage_offset()) * t.element_size();
  const size_t count = static_cast<size_t>(t.numel());
  const RedOp op = red.op;
  const int64_t divisor = red.divisor;
  return [storage = std::move(storage), offset, count, d, op, divisor](
             Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    void* data = static_cast<char*>(storage.mutable_data()) + offset;
    algo.allreduce(data, data, count, d, op, divisor, ctx, dl);
  };
}

// `t` passed single_tensor(), `d` is its dtype and `red` the reduction checked for it.
RingBackend::Body RingBackend::allreduce_body(const at::Tensor& t, DType d, const Reduction& red) {
  at::NoGradGuard no_grad;
  // The ring works on contiguous memory. For a strided tensor it works on a private copy (owned
  // by this op) and writes the result back only on success, so a failure leaves the caller's
  // tensor as it was.
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  // PREMUL_SUM scales this rank's contribution before the sum, into a tensor owned by the op.
  at::Tensor in = red.premul ? buf.mul(*red.premul) : buf;
  return [this, t, buf, in, d, red](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.allreduce(in.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), d, red.op,
                     red.divisor, ctx, dl);
    if (!buf.is_same(t)) t.copy_(buf);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::_reduce_scatter_base(
    at::Tensor& output_arg, at::Tensor& input_arg, const c10d::ReduceScatterOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  const auto [d, red] = checked_reduce_scatter(output, input, opts.reduceOp, rank_, size_);
  const auto device = checked_device("reduce_scatter", rank_, {output}, {input});
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", device, {output}, {input},
                 opts.timeout, opts.asyncOp, reduce_scatter_body(output, input, d, red));
}

// `output` and `input` passed checked_reduce_scatter(), which returned `d` and `red`.
RingBackend::Body RingBackend::reduce_scatter_body(const at::Tensor& output, const at::Tensor& input,
                                                   DType d, const Reduction& red) {
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  if (red.premul) in = in.mul(*red.premul);  // this rank's contribution, scaled, owned by the op
  at::Tensor out = writable(output, in);
  const size_t count = static_cast<size_t>(output.numel());
  return [this, output, in, out, d, red, count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.reduce_scatter(Chunks(in.data_ptr(), count * in.element_size()), out.data_ptr(), count,
                          d, red.op, red.divisor, ctx, dl);
    if (!out.is_same(output)) output.copy_(out);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs_arg, std::vector<std::vector<at::Tensor>>& inputs_arg,
    const c10d::ReduceScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "reduce_scatter";
  at::Tensor output = single_tensor(outputs, name, rank_);
  if (inputs.size() != 1) {
    fail(detail::cat(op_prefix("reduce_scatter", rank_), "expected one input list, got ",
                     inputs.size()));
  }
  check_list(inputs[0], output, size_, name, rank_, "input");
  const DType d = checked_dtype(output, name, rank_);
  const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
  const auto device = checked_device(name, rank_, {output}, inputs[0]);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> in;  // contiguous (or scaled) copies where needed, owned by the op
  for (const at::Tensor& t : inputs[0]) in.push_back(red.premul ? t.mul(*red.premul) : t.contiguous());
  at::Tensor out = output;
  for (const at::Tensor& t : in) {
    if (!output.is_contiguous() || at::get_overlap_status(output, t) != at::MemOverlapStatus::No) {
      out = at::empty(output.sizes(), output.options());
      break;
    }
  }
  const size_t count = static_cast<size_t>(output.numel());
  return enqueue(c10d::OpType::REDUCE_SCATTER, name, device, {output}, inputs[0], opts.timeout, opts.asyncOp,
                 [this, output, in, out, d, red, count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   std::vector<void*> ptrs;
                   for (const at::Tensor& t : in) ptrs.push_back(t.data_ptr());
                   algo.reduce_scatter(Chunks(&ptrs), out.data_ptr(), count, d, red.op,
                                         red.divisor, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::_allgather_base(at::Tensor& output_arg, at::Tensor& input_arg,
                                                            const c10d::AllgatherOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  check_allgather(output, input, rank_, size_);
  const auto device = checked_device("allgather", rank_, {output}, {input});
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "allgather", device, {output}, {input}, opts.timeout,
                 opts.asyncOp, allgather_body(output, input));
}

// `output` and `input` passed check_allgather().
RingBackend::Body RingBackend::allgather_body(const at::Tensor& output, const at::Tensor& input) {
  const auto [d, count] = as_moved(input);  // all-gather only moves bytes: any dtype
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  // The input may be the output's own chunk (all_gather_into_tensor on a view): the ring then
  // skips the copy; any other overlap goes through a private buffer.
  at::Tensor out = output;
  if (!output.is_contiguous()) {
    out = at::empty(output.sizes(), output.options());
  } else if (at::get_overlap_status(output, in) != at::MemOverlapStatus::No) {
    const auto* mine = static_cast<const uint8_t*>(output.data_ptr()) + rank_ * in.nbytes();
    if (mine != in.data_ptr()) out = at::empty(output.sizes(), output.options());
  }
  return [this, output, in, out, d = d, count = count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    algo.all_gather(in.data_ptr(), Chunks(out.data_ptr(), in.nbytes()), count, d, ctx, dl);
    if (!out.is_same(output)) output.copy_(out);
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs_arg,
                                                      std::vector<at::Tensor>& inputs_arg,
                                                      const c10d::AllgatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  at::Tensor input = single_tensor(inputs, "allgather", rank_);
  if (outputs.size() != 1) {
    fail(detail::cat(op_prefix("allgather", rank_), "expected one output list, got ",
                     outputs.size()));
  }
  check_list(outputs[0], input, size_, "allgather", rank_, "output");
  const auto device = checked_device("allgather", rank_, outputs[0], {input});
  return enqueue(c10d::OpType::ALLGATHER, "allgather", device, outputs[0], {input}, opts.timeout,
                 opts.asyncOp, allgather_list_body(outputs[0], input));
}

// `outputs` passed check_list() against `input`: one per rank, each like the input.
RingBackend::Body RingBackend::allgather_list_body(const std::vector<at::Tensor>& outputs,
                                                   const at::Tensor& input) {
  const auto [d, count] = as_moved(input);
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  std::vector<at::Tensor> user = outputs;
  std::vector<at::Tensor> out;  // the caller's tensors where the ring can write them directly
  for (const at::Tensor& t : user) {
    const bool direct = t.is_contiguous() && at::get_overlap_status(t, in) == at::MemOverlapStatus::No;
    out.push_back(direct ? t : at::empty(t.sizes(), t.options()));
  }
  return [this, user, in, out, d = d, count = count](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    std::vector<void*> ptrs;
    for (const at::Tensor& t : out) ptrs.push_back(t.data_ptr());
    algo.all_gather(in.data_ptr(), Chunks(&ptrs), count, d, ctx, dl);
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].is_same(user[i])) user[i].copy_(out[i]);
    }
  };
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce(std::vector<at::Tensor>& tensors_arg,
                                                   const c10d::ReduceOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  const char* name = "reduce";
  at::Tensor t = single_tensor(tensors, name, rank_);
  const int root = checked_root(opts.rootRank, name, rank_, size_);
  const DType d = checked_dtype(t, name, rank_);
  const Reduction red = checked_reduction(opts.reduceOp, d, name, rank_, size_);
  const auto device = checked_device(name, rank_, {t}, {});
  at::NoGradGuard no_grad;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  at::Tensor in = red.premul ? buf.mul(*red.premul) : buf;
  // Only the root's tensor is written; the others keep their values, as with torch's backends.
  return enqueue(c10d::OpType::REDUCE, name, device, {t}, {}, opts.timeout, opts.asyncOp,
                 [this, t, buf, in, d, red, root](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   algo.reduce(in.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), d,
                                 red.op, red.divisor, root, ctx, dl);
                   if (rank_ == root && !buf.is_same(t)) t.copy_(buf);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs_arg,
                                                   std::vector<at::Tensor>& inputs_arg,
                                                   const c10d::GatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "gather";
  at::Tensor input = single_tensor(inputs, name, rank_);
  const int root = checked_root(opts.rootRank, name, rank_, size_);
  std::vector<at::Tensor> user;
  if (rank_ == root) {
    if (outputs.size() != 1) {
      fail(detail::cat("ringreduce gather: rank ", rank_, " (the root): expected one output list, got ",
                       outputs.size()));
    }
    check_list(outputs[0], input, size_, name, rank_, "output");
    user = outputs[0];
  } else if (!outputs.empty() && !outputs[0].empty()) {
    fail(detail::cat(op_prefix("gather", rank_), "only the root (", root,
                     ") takes an output list"));
  }
  const auto device = checked_device(name, rank_, user, {input});
  const auto [d, count] = as_moved(input);
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  std::vector<at::Tensor> bufs = writable_list(user);
  return enqueue(c10d::OpType::GATHER, name, device, user, {input}, opts.timeout, opts.asyncOp,
                 [this, in, user, bufs, d = d, count = count, root](Collectives& algo, const OpContext& ctx,
                                                                    const Deadline& dl) {
                   std::vector<void*> ptrs = pointers(bufs);
                   algo.gather(in.data_ptr(), Chunks(&ptrs), count, d, root, ctx, dl);
                   copy_back(bufs, user);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::scatter(std::vector<at::Tensor>& outputs_arg,
                                                    std::vector<std::vector<at::Tensor>>& inputs_arg,
                                                    const c10d::ScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "scatter";
  at::Tensor output = single_tensor(outputs, name, rank_);
  const int root = checked_root(opts.rootRank, name, rank_, size_);
  std::vector<at::Tensor> ins;
  if (rank_ == root) {
    if (inputs.size() != 1) {
      fail(detail::cat("ringreduce scatter: rank ", rank_, " (the root): expected one input list, got ",
                       inputs.size()));
    }
    check_list(inputs[0], output, size_, name, rank_, "input");
    for (const at::Tensor& t : inputs[0]) ins.push_back(t.contiguous());
  } else if (!inputs.empty() && !inputs[0].empty()) {
    fail(detail::cat(op_prefix("scatter", rank_), "only the root (", root,
                     ") takes an input list"));
  }
  const auto device = checked_device(name, rank_, {output}, ins);  // ins: on the inputs' device
  const auto [d, count] = as_moved(output);
  at::NoGradGuard no_grad;
  at::Tensor out = output.is_contiguous() ? output : at::empty(output.sizes(), output.options());
  return enqueue(c10d::OpType::SCATTER, name, device, {output}, ins, opts.timeout, opts.asyncOp,
                 [this, ins, output, out, d = d, count = count, root](Collectives& algo, const OpContext& ctx,
                                                                      const Deadline& dl) {
                   std::vector<void*> ptrs = pointers(ins);
                   algo.scatter(Chunks(&ptrs), out.data_ptr(), count, d, root, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall_base(at::Tensor& output_arg, at::Tensor& input_arg,
                                                          std::vector<int64_t>& output_split_sizes,
                                                          std::vector<int64_t>& input_split_sizes,
                                                          const c10d::AllToAllOptions& opts) {
  const auto output = held(output_arg, opts.asyncOp);
  const auto input = held(input_arg, opts.asyncOp);
  const char* name = "alltoall";
  single_tensor({output}, name, rank_);
  single_tensor({input}, name, rank_);
  check_same_dtype(output, input, name, rank_, "the output");
  // Splits count rows (the first dimension); none means equal parts.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* what) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const int64_t row_elems = rows > 0 ? t.numel() / rows : 0;
    std::vector<size_t> c(size_);
    if (splits.empty()) {
      if (rows % size_ != 0) {
        fail(detail::cat(op_prefix("alltoall", rank_), "the ", what, "'s first dimension (",
                         rows, ") does not divide by the world size (", size_, ")"));
      }
      for (auto& x : c) x = static_cast<size_t>(rows / size_ * row_elems);
      return c;
    }
    int64_t total = 0;
    for (int64_t v : splits) total += v;
    if (static_cast<int>(splits.size()) != size_ || total != rows ||
        std::any_of(splits.begin(), splits.end(), [](int64_t v) { return v < 0; })) {
      fail(detail::cat(op_prefix("alltoall", rank_), what, " split sizes must be ",
                       size_, " non-negative numbers adding up to the first dimension (", rows, ")"));
    }
    for (int p = 0; p < size_; ++p) c[p] = static_cast<size_t>(splits[p] * row_elems);
    return c;
  };
  std::vector<size_t> send = counts(input, input_split_sizes, "input");
  std::vector<size_t> recv = counts(output, output_split_sizes, "output");
  const auto device = checked_device(name, rank_, {output}, {input});
  const auto [d, elem_scale] = moved_as(input);
  for (auto& x : send) x *= elem_scale;
  for (auto& x : recv) x *= elem_scale;
  at::NoGradGuard no_grad;
  at::Tensor in = input.contiguous();
  at::Tensor out = writable(output, in);
  return enqueue(c10d::OpType::ALLTOALL_BASE, name, device, {output}, {input}, opts.timeout, opts.asyncOp,
                 [this, in, output, out, send, recv, d = d](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   const size_t es = dtype_size(d);
                   std::vector<void*> ip, op;
                   auto* ib = static_cast<uint8_t*>(in.data_ptr());
                   auto* ob = static_cast<uint8_t*>(out.data_ptr());
                   for (int p = 0; p < size_; ++p) {
                     ip.push_back(ib);
                     op.push_back(ob);
                     ib += send[p] * es;
                     ob += recv[p] * es;
                   }
                   algo.alltoall(Chunks(&ip), send, Chunks(&op), recv, d, ctx, dl);
                   if (!out.is_same(output)) output.copy_(out);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::alltoall(std::vector<at::Tensor>& outputs_arg,
                                                     std::vector<at::Tensor>& inputs_arg,
                                                     const c10d::AllToAllOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  const char* name = "alltoall";
  if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
    fail(detail::cat(op_prefix("alltoall", rank_), "expected ", size_,
                     " input and output tensors, got ", inputs.size(), " and ", outputs.size()));
  }
  for (int p = 0; p < size_; ++p) {
    single_tensor({outputs[p]}, name, rank_);
    single_tensor({inputs[p]}, name, rank_);
    check_same_dtype(outputs[p], inputs[0], name, rank_, "an output");
    check_same_dtype(inputs[p], inputs[0], name, rank_, "an input");
  }
  const auto device = checked_device(name, rank_, outputs, inputs);
  const auto [d, scale] = moved_as(inputs[0]);
  std::vector<size_t> send, recv;
  for (int p = 0; p < size_; ++p) {
    send.push_back(static_cast<size_t>(inputs[p].numel()) * scale);
    recv.push_back(static_cast<size_t>(outputs[p].numel()) * scale);
  }
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> ins;
  for (const at::Tensor& t : inputs) ins.push_back(t.contiguous());
  std::vector<at::Tensor> user = outputs;
  std::vector<at::Tensor> bufs;
  for (const at::Tensor& t : user) {
    bool clear = t.is_contiguous();
    for (const at::Tensor& i : ins) clear = clear && at::get_overlap_status(t, i) == at::MemOverlapStatus::No;
    bufs.push_back(clear ? t : at::empty(t.sizes(), t.options()));
  }
  return enqueue(c10d::OpType::ALLTOALL, name, device, user, inputs, opts.timeout, opts.asyncOp,
                 [this, ins, user, bufs, send, recv, d = d](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   std::vector<void*> ip = pointers(ins), op = pointers(bufs);
                   algo.alltoall(Chunks(&ip), send, Chunks(&op), recv, d, ctx, dl);
                   copy_back(bufs, user);
                 });
}

c10::intrusive_ptr<c10d::Work> RingBackend::broadcast(std::vector<at::Tensor>& tensors_arg,
                                                      const c10d::BroadcastOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  const char* name = "broadcast";
  at::Tensor t = single_tensor(tensors, name, rank_);
  const int root = checked_root(opts.rootRank, name, rank_, size_);
  if (opts.rootTensor != 0) {
    fail(detail::cat(op_prefix("broadcast", rank_), "root tensor ", opts.rootTensor,
                     " does not exist: one tensor per rank"));
  }
  const auto [d, count] = as_moved(t);  // broadcast only moves bytes: any dtype
  const auto device = checked_device(name, rank_, {t}, {});

  at::NoGradGuard no_grad;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  return enqueue(c10d::OpType::BROADCAST, name, device, {t}, {}, opts.timeout, opts.asyncOp,
                 [this, t, buf, d = d, count = count, root](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
                   algo.broadcast(buf.data_ptr(), count, d, root, ctx, dl);
                   if (!buf.is_same(t) && rank_ != root) t.copy_(buf);
                 });
}

void RingBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const std::chrono::milliseconds t = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  monitored_barrier(*store_, detail::cat(prefix_, "monitored_barrier/", monitored_barriers_++, "/"),
                    rank_, size_, t, waitAllRanks);
}

c10::intrusive_ptr<c10d::Work> RingBackend::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(c10d::OpType::BARRIER, "barrier", std::nullopt, {}, {}, opts.timeout, opts.asyncOp,
                 [this](Collectives& algo, const OpContext& ctx, const Deadline& dl) { algo.barrier(ctx, dl); });
}

}  // namespace ringreduce

// The coalesced forms of RingBackend's collectives: one Work for several tensors, whose op runs
// the parts in order. Each part is checked at the call like the single form it repeats.
#include "backend/ring_backend.h"

#include <ATen/ATen.h>

#include <utility>

#include "algo/collectives.h"
#include "backend/storage_pins.h"
#include "backend/tensor_checks.h"
#include "common/error.h"

namespace ringreduce {

namespace {

// One op that runs `parts` one after the other.
RingBackend::Body in_order(std::vector<RingBackend::Body> parts) {
  return [parts = std::move(parts)](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    for (const auto& part : parts) part(algo, ctx, dl);
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors_arg, const c10d::AllreduceCoalescedOptions& opts) {
  const auto tensors = held(tensors_arg, opts.asyncOp);
  std::vector<Body> parts;
  for (const at::Tensor& t : tensors) {
    single_tensor({t}, "allreduce", rank_);
    const DType d = checked_dtype(t, "allreduce", rank_);
    const Reduction red = checked_reduction(opts.reduceOp, d, "allreduce", rank_, size_);
    parts.push_back(allreduce_body(t, d, red));
  }
  const auto device = checked_device("allreduce_coalesced", rank_, tensors, {});
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced", device, tensors, {},
                 opts.timeout, opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::AllgatherOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  check_pairs(outputs.size(), inputs.size(), "allgather_into_tensor_coalesced", rank_);
  std::vector<Body> parts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_allgather(outputs[i], inputs[i], rank_, size_);
    parts.push_back(allgather_body(outputs[i], inputs[i]));
  }
  const auto device = checked_device("allgather_into_tensor_coalesced", rank_, outputs, inputs);
  return enqueue(c10d::OpType::COALESCED, "allgather_into_tensor_coalesced", device, outputs, inputs,
                 opts.timeout, opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::ReduceScatterOptions& opts) {
  const auto outputs = held(outputs_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  check_pairs(outputs.size(), inputs.size(), "reduce_scatter_tensor_coalesced", rank_);
  std::vector<Body> parts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto [d, red] = checked_reduce_scatter(outputs[i], inputs[i], opts.reduceOp, rank_, size_);
    parts.push_back(reduce_scatter_body(outputs[i], inputs[i], d, red));
  }
  const auto device = checked_device("reduce_scatter_tensor_coalesced", rank_, outputs, inputs);
  return enqueue(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", device, outputs, inputs,
                 opts.timeout, opts.asyncOp, in_order(std::move(parts)));
}

c10::intrusive_ptr<c10d::Work> RingBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists_arg, std::vector<at::Tensor>& inputs_arg,
    const c10d::AllgatherOptions& opts) {
  const auto output_lists = held(output_lists_arg, opts.asyncOp);
  const auto inputs = held(inputs_arg, opts.asyncOp);
  // torch's layout (dist.all_gather_coalesced, as gloo reads it): one list per rank, each with
  // one tensor per input; output_lists[r][i] receives rank r's input i.
  const char* name = "allgather_coalesced";
  if (output_lists.size() != static_cast<size_t>(size_)) {
    fail(detail::cat(op_prefix(name, rank_), "expected one output list per rank (",
                     size_, "), got ", output_lists.size()));
  }
  for (size_t r = 0; r < output_lists.size(); ++r) {
    if (output_lists[r].size() != inputs.size()) {
      fail(detail::cat(op_prefix(name, rank_), "output list ", r, " has ",
                       output_lists[r].size(), " tensors for ", inputs.size(), " inputs"));
    }
  }
  std::vector<Body> parts;
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> gathered;  // input i of every rank
    for (const std::vector<at::Tensor>& list : output_lists) gathered.push_back(list[i]);
    check_list(gathered, inputs[i], size_, "allgather", rank_, "output");
    parts.push_back(allgather_list_body(gathered, inputs[i]));
  }
  for (const std::vector<at::Tensor>& list : output_lists) {
    outputs.insert(outputs.end(), list.begin(), list.end());
  }
  const auto device = checked_device(name, rank_, outputs, inputs);
  return enqueue(c10d::OpType::ALLGATHER_COALESCED, name, device, outputs, inputs, opts.timeout,
                 opts.asyncOp, in_order(std::move(parts)));
}

}  // namespace ringreduce

// All-reduce of sparse COO tensors, built on the dense collectives.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/cuda_side.h"  // RingBody

namespace ringreduce {

// SUM only, on CPU, as gloo offers it (DDP with sparse embedding gradients relies on it). Every
// rank's indices and values are gathered, padded to the largest count of non-zeros, concatenated
// in rank order and coalesced, so that every rank ends with the same tensor, which replaces `t`'s
// contents. Ranks whose tensors differ in shape, dimensions or dtype fail together. Throws at the
// call for what it cannot do.
RingBody sparse_allreduce_body(const at::Tensor& t, const c10d::ReduceOp& op, int rank, int size);

}  // namespace ringreduce

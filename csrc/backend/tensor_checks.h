// The checks an entry point of RingBackend runs on the caller's tensors and arguments, on the
// caller's thread, before it builds an op: one tensor per call, dense, on a device this build
// handles, of a dtype and reduce op the kernels know, lists of the right length, roots and peers
// inside the group. Each throws c10::DistBackendError naming the op and the rank.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/flight_recorder.h"

namespace ringreduce {

#ifdef RINGREDUCE_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

// Why this build has no CUDA side, as setup.py found at build time.
inline const char* cuda_build_note() {
#ifdef RINGREDUCE_CUDA_NOTE
  return RINGREDUCE_CUDA_NOTE;
#else
  return "built without CUDA";
#endif
}

// Throws c10::DistBackendError (torch.distributed.DistBackendError in Python) with `msg`.
[[noreturn]] void fail(const std::string& msg);

// The shapes of an op's tensors for the flight recorder: pointers to the tensors' own sizes, valid
// while the tensors are (no copy, no allocation).
inline FlightRecorder::Shapes shapes_of(at::ArrayRef<at::Tensor> ts) {
  FlightRecorder::Shapes sh;
  sh.tensors = ts.size();
  sh.shown = std::min(ts.size(), FlightRecorder::kShown);
  for (size_t i = 0; i < sh.shown; ++i) {
    const c10::IntArrayRef sizes = ts[i].sizes();
    sh.dims[i] = sizes.data();
    sh.ndim[i] = sizes.size();
  }
  return sh;
}

// The torch layer's one dtype dispatch point: at::ScalarType to the core's tag.
std::optional<DType> core_dtype(at::ScalarType s);

// What a c10d::ReduceOp means for the ring: a kernel op, plus AVG's divisor or PREMUL_SUM's factor.
struct Reduction {
  RedOp op = RedOp::Sum;
  int64_t divisor = 1;
  std::optional<double> premul;
};

// One CPU (or CUDA) tensor, strided, of a dtype ringreduce handles: anything else fails here, at
// the call.
at::Tensor single_tensor(const std::vector<at::Tensor>& tensors, const char* op, int rank);
// A tensor an op can work on in place with no copy: dense, contiguous, on the CPU.
inline bool dense_cpu(const at::Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && t.is_contiguous();
}
DType checked_dtype(const at::Tensor& t, const char* op, int rank);
Reduction checked_reduction(const c10d::ReduceOp& rop, DType d, const char* op, int rank, int size);
void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* op, int rank,
                      const char* what);
// A list that must hold exactly `n` tensors shaped like `like` (CPU, same dtype and element count).
void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, int n, const char* op,
                int rank, const char* what);
// One reduce-scatter pair: one tensor each, of one dtype the kernels know, the input world size
// times the output's elements. Returns the dtype and what `rop` means for it.
std::pair<DType, Reduction> checked_reduce_scatter(const at::Tensor& output, const at::Tensor& input,
                                                   const c10d::ReduceOp& rop, int rank, int size);
// One all-gather pair: one tensor each, of one dtype (any: all-gather only moves bytes), the
// output world size times the input's elements.
void check_allgather(const at::Tensor& output, const at::Tensor& input, int rank, int size);
// A root rank of the group.
int checked_root(int64_t root, const char* op, int rank, int size);
// A coalesced call's lists: as many outputs as inputs.
void check_pairs(size_t outputs, size_t inputs, const char* op, int rank);
// A point-to-point peer (`what`: "destination", "source"): in the group, and not this rank.
void check_peer(int peer, int rank, int size, const char* op, const char* what);

// The last check of an op, once each of its tensors passed the others: every defined tensor of
// `outputs` and `inputs` on one device, which it returns (none for an op without tensors) and
// where the op runs. A CUDA device fails here in a build without CUDA.
std::optional<c10::Device> checked_device(const char* op, int rank,
                                          const std::vector<at::Tensor>& outputs,
                                          const std::vector<at::Tensor>& inputs);

}  // namespace ringreduce

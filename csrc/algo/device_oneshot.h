// The stream-ordered one-shot all-reduce of device buffers, over a DeviceWindow.
//
// Each rank copies its input into its window's staging slot, posts, has its stream wait for
// every peer's post, and reduces every rank's staged input, in rank order, into its output: all
// of it queued on one stream at the call, ordered between the ranks by the GPU (see
// transport/cuda_ipc/device_window.h). A tensor larger than a slot goes in chunks, one ordering
// point each. Two slots alternate: a rank writes slot k&1 for chunk k only after its stream waited
// for every peer's post of chunk k-1, which each peer queued after its reduction of chunk k-2,
// the last reader of that slot. So one ordering point per chunk suffices.
//
// One-shot at every size: when the ranks share one GPU, every byte any algorithm moves goes
// through the same memory, and each further ordering point costs a switch between the ranks'
// GPU contexts (about 75 us each without MPS): docs/gpu.md has the measurements.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "transport/cuda_ipc/device_window.h"

struct CUstream_st;

namespace ringreduce {

class DeviceOneShot {
 public:
  // Inputs one reduction kernel takes (reduce/reduce_cuda.h): larger groups take the ring.
  static constexpr int kMaxRanks = 8;

  explicit DeviceOneShot(DeviceWindow& w) : w_(w) {}

  // Queues out = in_0 op in_1 op ... (then / divisor when divisor > 1) on `s`; `in` may be `out`.
  // Every rank must queue the same ops in the same order with the same count, dtype and op.
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 CUstream_st* s);
  // The last ordering point queued (0: none yet): what an abort must release through.
  uint32_t last_seq() const { return seq_; }

 private:
  DeviceWindow& w_;
  uint32_t seq_ = 0;
};

}  // namespace ringreduce

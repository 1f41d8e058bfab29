// The stream-ordered one-shot all-reduce of device buffers, over a DeviceWindow.
//
// Each rank copies its input into its window's staging slot, posts, has its stream wait for
// every peer's post, admits the turn, and reduces every rank's staged input, in rank order, into
// its output: all of it queued on one stream at the call, ordered between the ranks by the GPU
// (see transport/cuda_ipc/device_window.h). A tensor larger than a slot goes in chunks, one turn
// each. Two slots alternate by the window's turn counter: a rank writes slot k&1 in turn k only
// after its stream admitted turn k-1, which needed every peer's post of turn k-1, queued after
// that peer's reduction of turn k-2, the last reader of that slot. So one ordering point per
// chunk suffices, and as the slot is read from the device's counter, a captured op replays right.
//
// One-shot at every size: when the ranks share one GPU, every byte any algorithm moves goes
// through the same memory, and each further ordering point costs a switch between the ranks'
// GPU contexts (about 75 us each without MPS): docs/results_gpu.md has the measurements.
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
  // Every rank must queue the same ops in the same order with the same count, dtype and op: a
  // rank whose count, dtype or op differs from a peer's in the same turn makes both write nothing
  // and report it (DeviceWindow::mismatch). `tag` names this rank's op in that report.
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 uint32_t tag, CUstream_st* s);

  // The Print's meta word for a call, and back.
  static uint32_t meta_of(DType t, RedOp op) {
    return (static_cast<uint32_t>(t) << 8) | static_cast<uint32_t>(op);
  }
  static DType dtype_of(uint32_t meta) { return static_cast<DType>(meta >> 8); }
  static RedOp op_of(uint32_t meta) { return static_cast<RedOp>(meta & 0xff); }

 private:
  DeviceWindow& w_;
};

}  // namespace ringreduce

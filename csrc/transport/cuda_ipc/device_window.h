// A device window: ranks whose GPUs share a host (several ranks on one GPU included) order their
// work on the device, with no host wait between them.
//
// Each rank owns one device allocation, exported through CUDA IPC and mapped by every peer: a
// control page (window_kernels.h), then two staging slots of `slot_bytes`. The ranks take turns:
// in each, every rank stages its part in slot (turn & 1) of its window, posts (adds one to its
// semaphore in every peer's page), has its stream wait until each peer's semaphore in its own
// page is at least one (a stream memory wait), admits the turn (takes one from each, checks that
// the peers' calls agree with its own, advances its turn counter), then reads the peers' slots.
// So an op queued by every rank's host at its call is ordered between the ranks by the GPU alone:
// the host queues, returns, and never waits for a peer.
//
// Nothing a rank queues depends on how many turns came before: the semaphores count posts not yet
// admitted, and the kernels read the slot from the turn counter on the device. A CUDA graph that
// captured an op therefore replays it right, in any order with ops queued at their call.
//
// Every wait a rank queues is on its own memory, so the window's abort method can release them
// from the host side; the copies and kernels queued behind a released wait read abort_word() and
// write nothing, and the abort method sets the peers' abort words too, so that what this rank still
// posts lets no peer reduce a slot this rank no longer fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/cuda_ipc/window_kernels.h"
#include "transport/transport.h"

struct CUstream_st;

namespace ringreduce {

class DeviceWindow {
 public:
  static constexpr int kMaxRanks = window::kMaxRanks;

  // Collective over the group, through `bs` (keys under `prefix`). Throws CudaIpcUnavailable,
  // with the same reason on every rank, when some rank cannot allocate, export or open a window,
  // or two ranks' GPUs have no atomics between them.
  DeviceWindow(Bootstrap& bs, const std::string& prefix, int rank, int size, size_t slot_bytes,
               int device);
  ~DeviceWindow();
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  // Whether a peer's process runs on this rank's GPU (the GPU then switches between their contexts).
  bool shares_gpu() const { return shares_gpu_; }

  // Staging slot `which` (0 or 1) of rank r's window, as this process addresses it.
  void* slot(int r, int which) const;
  // Device address of this rank's turn counter: a turn's slot is (turn & 1) until admit() and
  // ((turn - 1) & 1) after it.
  const volatile uint32_t* turn_word() const;
  // Queued on `s`, one turn: post() once the stream's earlier work (this rank's staged input) is
  // done, wait_peers() for every peer's post, admit() before anything reads a peer's slot.
  void post(const window::Print& print, CUstream_st* s);
  void wait_peers(CUstream_st* s);
  void admit(CUstream_st* s);
  // Device address of this rank's abort word (0 until the window's abort method ran or an admit
  // found the ranks' calls disagreeing).
  const volatile uint32_t* abort_word() const;
  // The first disagreement this rank's admits found, from host memory; false while there is none.
  bool mismatch(window::Mismatch* out) const;
  // That record itself, which outlives the window for whoever holds it (an op's end), and whether
  // it rejects the op this rank tagged `tag`: the disagreeing turn was that op's or an earlier
  // one's (the window writes nothing after it).
  std::shared_ptr<const window::Mismatch> mismatch_record() const { return mismatch_; }
  static bool rejects(const window::Mismatch& m, uint32_t tag) {
    const auto& v = reinterpret_cast<const volatile window::Mismatch&>(m);
    return v.flag != 0 && static_cast<int32_t>(v.mine.tag - tag) <= 0;
  }
  // From any host thread: sets this rank's abort word and every peer's, then lets every wait this
  // rank has queued, and will queue, pass. Queued on a stream of its own, so it runs while the
  // ops' stream is blocked (unless the device runs all streams through one queue:
  // CUDA_DEVICE_MAX_CONNECTIONS=1).
  void abort();  // exit-ok: the window's waits, not the process
  // The destructor then leaves this rank's allocation to the process's end: a peer may still map
  // it (the group's closing barrier did not complete).
  void keep_memory() { free_own_ = false; }

 private:
  uint8_t* base(int r) const { return r == rank_ ? own_ : peers_[r]; }

  int rank_;
  int size_;
  size_t slot_bytes_;
  int device_;
  uint8_t* own_ = nullptr;       // cudaMalloc'ed here
  std::vector<uint8_t*> peers_;  // opened through IPC here
  window::Bases bases_{};        // own_ and peers_, for the kernels
  std::shared_ptr<window::Mismatch> mismatch_;  // host memory, mapped for the device
  CUstream_st* side_ = nullptr;  // the abort method's stream
  bool free_own_ = true;
  bool shares_gpu_ = false;
};

}  // namespace ringreduce

// A device window: ranks whose GPUs share a host (several ranks on one GPU included) order their
// work on the device, with no host wait between them.
//
// Each rank owns one device allocation, exported through CUDA IPC and mapped by every peer:
// a control page of counters, then two staging slots of `slot_bytes`. A rank's counter for peer p
// lives in the rank's own page and is written only by p (a stream memory write, after p's earlier
// work on its stream and a memory fence); the rank's stream waits on it with a stream memory wait.
// So an op queued by every rank's host at its call is ordered between the ranks by the GPU alone:
// the host queues, returns, and never waits for a peer (measured on one H100/H200 with 2 ranks:
// docs/gpu.md).
//
// Every wait a rank queues is on its own memory, so the window's abort method can release them
// from the host side; the copies and kernels queued behind a released wait read abort_word() and
// write nothing, and the abort method sets the peers' abort words too, so that what this rank still posts lets no peer reduce
// a slot this rank no longer fills.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/transport.h"

struct CUstream_st;

namespace ringreduce {

class DeviceWindow {
 public:
  static constexpr int kMaxRanks = 64;  // counters in one 4 KiB control page, 64 bytes apart

  // Collective over the group, through `bs` (keys under `prefix`). Throws CudaIpcUnavailable,
  // with the same reason on every rank, when some rank cannot allocate, export or open a window.
  DeviceWindow(Bootstrap& bs, const std::string& prefix, int rank, int size, size_t slot_bytes,
               int device);
  ~DeviceWindow();
  DeviceWindow(const DeviceWindow&) = delete;
  DeviceWindow& operator=(const DeviceWindow&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // Staging slot `which` (0 or 1) of rank r's window, as this process addresses it.
  void* slot(int r, int which) const;
  // Queued on `s`: once the stream's earlier work is done (and visible), every peer's counter for
  // this rank becomes `seq`.
  void post(uint32_t seq, CUstream_st* s);
  // Queued on `s`: the stream goes on once every peer has posted `seq` or later (counters compare
  // modulo 2^32, so they may wrap).
  void wait_peers(uint32_t seq, CUstream_st* s);
  // Device address of this rank's abort word (0 until the window's abort method ran).
  const volatile uint32_t* abort_word() const;
  // From any host thread: sets this rank's abort word and every peer's, then lets every wait this
  // rank has queued up to `through` pass. Queued on a stream of its own, so it runs while the ops'
  // stream is blocked (unless the device runs all streams through one queue:
  // CUDA_DEVICE_MAX_CONNECTIONS=1).
  void abort(uint32_t through);  // exit-ok: the window's waits, not the process
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
  CUstream_st* side_ = nullptr;  // the abort method's stream
  bool free_own_ = true;
};

}  // namespace ringreduce

// Stream-ordered CUDA ops: queued on the group's stream at the call, on the caller's thread, and
// ordered between the ranks by the GPU (algo/device_oneshot.h over a DeviceWindow). No host
// thread waits for a peer, so an op costs its caller the time to queue it.
//
// As with NCCL: the op's stream first waits for an event on the caller's current stream;
// Work::wait() and synchronize() make the caller's current stream wait for the op's end and return
// at once; isCompleted() asks the op's end event; the future completes on the op's stream.
//
// A watchdog thread, running only while ops are in flight, looks at each op's end event every
// millisecond. An op that does not end by its deadline, a peer process that dies, ranks whose
// calls disagree (found on the device), or an abort of the group's host side makes it abort the
// window: its waits are released on the device, the kernels behind them write nothing (the
// callers' tensors stay as they were), the group's host side is aborted too (the peers learn it),
// and every op in flight fails with a message that names the op, the rank and the cause.
//
// An op called while the caller's stream is captured into a CUDA graph goes into the graph and
// runs at each replay. Replays run with no host code, so once a group has captured an op its
// watchdog looks at the peers every 100 ms for as long as the group lives: a dead peer, a
// disagreement or an abort then releases a replay's waits as it does an op's.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "algo/device_oneshot.h"
#include "transport/cuda_ipc/device_window.h"
#include "transport/transport.h"

struct CUevent_st;

namespace ringreduce {

class EventPool;

class CudaOrdered {
 public:
  // `host`: the group's control (abort and peer liveness); `finished(seq, error)` is called once
  // per op when it ends ("" on success), from the watchdog thread.
  CudaOrdered(std::unique_ptr<DeviceWindow> window, GroupControl& host,
              std::function<void(uint64_t, const std::string&)> finished);
  ~CudaOrdered();

  // Whether an all-reduce of `count` elements of `t` with `op` and `divisor` takes this path: the
  // same answer on every rank for the same call (it depends on nothing but the call and the
  // group). Groups of more ranks than one kernel reduces, and averages (whose division would run
  // after an abort's released waits), take the ring.
  bool takes_allreduce(RedOp op, int64_t divisor) const;

  // Queues the all-reduce of `in` into `out` (both contiguous, on the group's device; `in` may be
  // `out`) on `comm` after `caller`'s work, and returns its Work, whose result() and future give
  // `result` (the caller's tensor).
  c10::intrusive_ptr<c10d::Work> allreduce(const char* name, uint64_t seq, int rank,
                                           const at::Tensor& in, const at::Tensor& out,
                                           const at::Tensor& result, DType t, RedOp op,
                                           std::chrono::milliseconds timeout,
                                           c10::cuda::CUDAStream comm, c10::cuda::CUDAStream caller);
  // Returns once no op is in flight: each has ended on the device or failed (then its waits were
  // released). Before the group's window goes away; the watchdog stops looking at the peers for
  // replays.
  void quiesce();
  // Whether an op was captured in a CUDA graph (replays may run on any stream).
  bool captured() const;
  // The window's memory stays allocated when this goes (DeviceWindow::keep_memory).
  void keep_window_memory();

  // Why the window was aborted, or "" (then later ops fail at their call).
  std::string abort_reason() const;
  // Aborts from outside (the group's abort): as the watchdog does, with `why`.
  void abort(const std::string& why);  // exit-ok: the group's, not the process

 private:
  struct Pending;
  void watch();
  void fail_all(const std::string& why);  // under mu_
  // What the window's admits found, as an error, or "".
  std::string disagreement() const;

  std::unique_ptr<DeviceWindow> window_;
  std::shared_ptr<EventPool> events_;
  CUevent_st* ready_ = nullptr;  // cudaEvent_t: the caller's stream, recorded for each op
  DeviceOneShot oneshot_;
  GroupControl& host_;
  std::function<void(uint64_t, const std::string&)> finished_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::string aborted_;
  bool stopping_ = false;
  bool replays_ = false;  // an op was captured in a CUDA graph: replays may run at any time
  bool closing_ = false;  // quiesce() ran
  std::thread watchdog_;
};

}  // namespace ringreduce

// The CUDA side of a ringreduce group: what an op on CUDA tensors runs with, built only when the
// extension is (setup.py: torch with CUDA and nvcc; RINGREDUCE_WITH_CUDA).
//
// Streams, as torch's own GPU backends use them:
// - At the call, on the caller's thread, an event is recorded on the caller's current stream, and
//   the op's tensors are recorded as used on the group's communication stream (one per group, on
//   the group's device), so that the caching allocator does not hand their memory out while the
//   op may still touch it.
// - On the progress thread, the communication stream waits for that event before the op's first
//   kernel; the ring then runs with CUDA kernels on that stream, and the op ends by synchronising
//   it, so that a completed Work is complete on the device as well.
// - Work::wait() blocks the caller until then. A wait that only holds the caller's stream (a
//   host function on it) deadlocked on an H100 against CUDA calls of the running op that
//   synchronise the device, so it waits for the ring's hand-offs to move onto the device.
//
// The transport is set up at the group's first CUDA op, which every rank reaches at the same
// point of the group's op order: CUDA IPC between device inboxes when every rank can open every
// other's (one host), else messages staged through host memory over the group's own transport.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include "backend/config.h"
#include "common/dtype.h"
#include "common/deadline.h"
#include "transport/transport.h"

namespace c10::cuda {
class CUDAStream;  // c10/cuda/CUDAStream.h, which a build without CUDA does not have
}

namespace ringreduce {

class Collectives;

// What an op does once its turn comes, through the algorithm layer it is given (the host's, or
// the device's over its own transport).
using RingBody = std::function<void(Collectives&, const OpContext&, const Deadline&)>;

class CudaSide {
 public:
  // `host`: the group's host transport (outlives this), carrying staged messages when CUDA IPC
  // cannot join the ranks. `prefix`: the group's store prefix. `finished(seq, error)`: called
  // once per stream-ordered op when it ends on the device ("" on success).
  CudaSide(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size,
           const Config& cfg, Transport& host,
           std::function<void(uint64_t, const std::string&)> finished);
  ~CudaSide();

  // At the call, on the caller's thread: checks that `device` is this group's device (its first
  // CUDA op fixes it), records the caller's stream and the tensors' use, and returns what the
  // progress thread runs for the op.
  std::function<void(const OpContext&, const Deadline&)> prepare(
      const char* op, const c10::Device& device, const std::vector<at::Tensor>& used, RingBody body);

  // Whether an all-reduce on `device` with `op` and `divisor` is stream-ordered (backend/
  // cuda_ordered.h) rather than run by the ring: the same answer on every rank for the same call.
  // Sets the device transport up at the group's first CUDA op, as prepare() does.
  bool takes_ordered_allreduce(const char* op, const c10::Device& device, RedOp red, int64_t divisor);
  // Queues that all-reduce of `in` into `out` (contiguous; `in` may be `out`) after the caller's
  // current stream, and returns its Work, whose result is `result` (the caller's tensor).
  c10::intrusive_ptr<c10d::Work> ordered_allreduce(const char* op, uint64_t seq, const at::Tensor& in,
                                                   const at::Tensor& out, const at::Tensor& result,
                                                   DType t, RedOp red, std::chrono::milliseconds timeout);

  // "cuda_ipc" or "staged" once the first CUDA op set the transport up, "" before.
  std::string transport_name() const;
  // Aborts the device transport's group too (it has a control plane of its own).
  void abort_group(const std::string& why);
  std::vector<std::string> linked_segments() const;

 private:
  // The group's stream on `device` (its first CUDA op fixes the device and sets the transport
  // up); throws for another device.
  c10::cuda::CUDAStream comm_stream(const char* op, const c10::Device& device);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringreduce

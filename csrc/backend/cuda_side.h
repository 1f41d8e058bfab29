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

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/config.h"
#include "common/deadline.h"
#include "transport/transport.h"

namespace ringreduce {

class Collectives;

// What an op does once its turn comes, through the algorithm layer it is given (the host's, or
// the device's over its own transport).
using RingBody = std::function<void(Collectives&, const OpContext&, const Deadline&)>;

class CudaSide {
 public:
  // `host`: the group's host transport (outlives this), carrying staged messages when CUDA IPC
  // cannot join the ranks. `prefix`: the group's store prefix.
  CudaSide(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size,
           const Config& cfg, Transport& host);
  ~CudaSide();

  // At the call, on the caller's thread: checks that `device` is this group's device (its first
  // CUDA op fixes it), records the caller's stream and the tensors' use, and returns what the
  // progress thread runs for the op.
  std::function<void(const OpContext&, const Deadline&)> prepare(
      const char* op, const c10::Device& device, const std::vector<at::Tensor>& used, RingBody body);

  // "cuda_ipc" or "staged" once the first CUDA op set the transport up, "" before.
  std::string transport_name() const;
  // Aborts the device transport's group too (it has a control plane of its own).
  void abort_group(const std::string& why);
  std::vector<std::string> linked_segments() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringreduce

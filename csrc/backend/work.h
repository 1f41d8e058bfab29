// The Work handed back by every ringreduce op.
//
// Completed by the group's progress thread; wait() blocks the caller and re-raises the op's error.
// A CUDA op completes once it is done on the device too (CudaSide), and its future carries the
// device, so that callbacks and value() order the caller's streams after it. The future's value is the output tensor
// list, which torch's DDP and comm hooks rely on.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/storage_pins.h"

namespace ringreduce {

struct QueueState;

// Not final: a queued op's Work is the op too (see issue.cpp), one allocation for both.
class RingWork : public c10d::Work {
 public:
  // `queue`: the state of the group's op queue, whose progress thread completes queued ops; a
  // wait on that thread runs them itself (see run_queued_here_until).
  RingWork(int rank, c10d::OpType type, const char* op_name, uint64_t seq,
           std::vector<at::Tensor> outputs, std::shared_ptr<QueueState> queue,
           std::vector<c10::Device> devices = {});

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // A flag set once the Work has completed answers without the Work's lock (a small op's wait()
  // asks up to three times); it is set just after the waiters are woken, so while it is not, the
  // Work's own state answers.
  bool isCompleted() override {
    return ended_.load(std::memory_order_acquire) || c10d::Work::isCompleted();
  }
  // Whether complete() (or complete_unshared()) has run to its end: isCompleted() without the
  // Work's lock for the moment between the two, which only a caller that looks again needs.
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  const std::vector<at::Tensor>& outputs() const { return outputs_; }
  // For a synchronous op that ran at its call, made with no outputs: the Work refers to the
  // caller's tensor, reduced in place, without owning it. Since torch keeps a tensor's Python
  // object alive while C++ holds further references to it, a Work that owned the tensor would take
  // the GIL again when it is destroyed (its Python wrapper drops it with the GIL released) to let
  // go of that object: a round trip of the GIL per dist.all_reduce. result() and the future give
  // the tensor while the caller still holds it, and fail saying so once nobody does.
  void refer_to(const at::Tensor& t);
  uint64_t getSequencenumber() const override { return seq_; }
  // The rank a receive's data came from (recvAnysource); set before complete().
  int sourceRank() const override;
  void set_source_rank(int r) { source_rank_.store(r); }

  // Called once, by whichever thread ran the op (or cancelled it). `error` is null on success.
  // Unpins first (see pin()) and lets the op's own state go (release_op()).
  void complete(std::exception_ptr error);
  // complete() for a Work made for an op that has already run, before anyone else has it (no
  // waiter, no future, no pins, no queued body): its state is set without the two locks and the
  // wake-up complete() takes, which were a tenth of a small synchronous op's own code.
  void complete_unshared(std::exception_ptr error);

  // An op that may still touch these tensors after its call returns (an async host op) keeps
  // their storages in place until it completes (see StoragePins): before its Work completes, so
  // that a resize_ after wait() works, and also when the op is cancelled before it ran.
  void pin(std::initializer_list<const std::vector<at::Tensor>*> lists) { pins_.emplace(lists); }

  // A queued host op: a wait() that finds it not started yet runs it (and the ops queued before
  // it) on the waiting thread instead of waking the progress thread for it.
  void run_on_wait() { run_on_wait_ = true; }
  // When it was queued for the progress thread at once (OpQueue::push): its first wait() tells the
  // queue how soon after the call its caller waits (note_wait).
  void set_pushed_at(std::chrono::steady_clock::time_point t) {
    pushed_at_ns_.store(t.time_since_epoch().count(), std::memory_order_relaxed);
  }

  const char* op_name() const { return op_name_; }
  uint64_t seq() const { return seq_; }
  int rank() const { return rank_; }

 protected:
  // What a subclass holds only for running the op (a queued op's body and the tensors it
  // captured), dropped when the op completes: the caller may keep the Work long after.
  virtual void release_op() {}

 private:
  const char* op_name_;
  uint64_t seq_;
  int rank_;
  std::vector<at::Tensor> outputs_;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> referred_;  // refer_to()
  // outputs_, or the tensor referred to; throws if that tensor no longer exists.
  std::vector<at::Tensor> output_list() const;
  std::shared_ptr<QueueState> queue_;
  std::thread::id progress_thread_;
  bool run_on_wait_ = false;
  std::atomic<int64_t> pushed_at_ns_{0};  // 0: not set, or its wait() has been noted
  std::atomic<int> source_rank_{-1};
  std::optional<StoragePins> pins_;  // set before the op is queued, reset by complete()
  std::atomic<bool> ended_{false};    // set by complete() once the Work has completed
  // The future is made when someone asks for it (DDP, comm hooks, torch.compile's functional
  // collectives do; a plain dist.all_reduce does not): making and completing one is most of what
  // a small op costs this layer. Whichever of getFuture() and complete() comes second completes
  // it, once (see both).
  std::mutex future_mu_;
  std::vector<c10::Device> devices_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Turns whatever an op threw into the c10::DistBackendError that Python sees as
// torch.distributed.DistBackendError, keeping the message.
std::exception_ptr as_dist_error(std::exception_ptr e);

}  // namespace ringreduce

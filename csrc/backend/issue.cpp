// How RingBackend issues and runs an op, whatever the op: the sequence number, the flight record,
// the deadline, the failure's log line and dump (run_op); queued for the progress thread or run on
// the caller's thread (enqueue); and the all-reduce that runs at its call with no queued form at
// all (allreduce_inline), which dist.all_reduce and the direct op take on an idle group.
#include "backend/ring_backend.h"

#include <ATen/ATen.h>

#include <utility>

#include "algo/collectives.h"
#include "backend/queued_op.h"
#include "backend/storage_pins.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/links.h"

namespace ringreduce {

void RingBackend::run_op(const char* name, uint64_t seq, std::chrono::milliseconds t,
                         const std::string& traced,
                         c10::function_ref<void(const OpContext&, const Deadline&)> run,
                         Clock::time_point began) {
  OpContext ctx;
  ctx.name = name;
  ctx.seq = seq;
  ctx.timeout = t;
  if (began == Clock::time_point{}) {
    began = Clock::now();
    flight_->started(seq, began);
  }
  try {
    // An aborted group runs no more ops. A rank stopped with this op issued and resumed after
    // its peers gave up on it would otherwise complete it, where the data it needs had come
    // before the abort, although every peer failed it; only its next op would fail.
    const std::string aborted = links_->transport().control().abort_reason();
    if (!aborted.empty()) throw_aborted(ctx, rank_, aborted);
    // The deadline starts when the op starts: time spent queued behind earlier ops is theirs.
    run(ctx, Deadline{began + t});
  } catch (const std::exception& e) {
    flight_->finished(seq, e.what(), Clock::now());
    if (log::enabled(log::Level::Warn)) {
      log::write(log::Level::Warn, rank_, detail::cat(name, " #", seq, " failed: ", e.what()));
    }
    dump_on_failure(detail::cat(name, " #", seq, " failed: ", e.what()));
    throw;
  } catch (...) {
    flight_->finished(seq, "unknown error", Clock::now());
    if (log::enabled(log::Level::Warn)) {
      log::write(log::Level::Warn, rank_, detail::cat(name, " #", seq, " failed"));
    }
    dump_on_failure(detail::cat(name, " #", seq, " failed"));
    throw;
  }
  const Clock::time_point ended = Clock::now();
  flight_->finished(seq, "", ended);
  if (!traced.empty()) {
    const double us = std::chrono::duration<double, std::micro>(ended - began).count();
    log::write(log::Level::Trace, rank_, detail::cat(traced, ": done in ", us, " us"));
  }
}

c10::intrusive_ptr<c10d::Work> RingBackend::enqueue(c10d::OpType type, const char* name,
                                                    std::optional<c10::Device> device,
                                                    std::vector<at::Tensor> outputs,
                                                    const std::vector<at::Tensor>& inputs,
                                                    std::chrono::milliseconds timeout,
                                                    bool async_op, Body body) {
  // The entry point checked the tensors and found `device` (checked_device): nothing here fails
  // for the caller's input. A build without CUDA never gets a CUDA device. A host op runs its
  // body on the host's ring; a CUDA op runs what CudaSide makes of it (`run`).
  const bool on_cuda = kWithCuda && device && device->is_cuda();
  std::function<void(const OpContext&, const Deadline&)> run;
#ifdef RINGREDUCE_WITH_CUDA
  if (on_cuda) {
    std::vector<at::Tensor> used = outputs;
    used.insert(used.end(), inputs.begin(), inputs.end());
    run = cuda_->prepare(name, *device, used, std::move(body));
  }
#endif
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t seq = next_seq_++;
  // One clock read for its issue: the flight record's, and a deferred op's (OpQueue::push).
  const Clock::time_point issued_at = Clock::now();
  const bool recorded = flight_->capacity() != 0;
  if (recorded) {
    // Under mu_, which serializes the group's issue records as the flight recorder needs.
    flight_->issued(seq, name, shapes_of(outputs),
                    outputs.empty() ? "" : c10::toString(outputs[0].scalar_type()), issued_at);
  }
  c10::intrusive_ptr<RingWork> work;
  std::function<void()> task;
  bool claimed = false;
  try {
    // A CUDA op's wait() blocks the host until the op is done on the device too (see cuda_side.h).
    auto op = c10::make_intrusive<QueuedOp>(rank_, type, name, seq, std::move(outputs), queue_.state(),
                                            on_cuda ? std::vector<c10::Device>{*device}
                                                    : std::vector<c10::Device>{});
    // An async op's caller may replace or grow its tensors' storages before wait(); the op keeps
    // them in place until it ends (a CUDA op's memory is the caching allocator's business).
    if (async_op && !on_cuda) op->pin({&op->outputs(), &inputs});
    op->body = std::move(body);
    op->run = std::move(run);
    op->timeout = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
    if (log::enabled(log::Level::Trace)) {
      const std::vector<at::Tensor>& outs = op->outputs();
      op->traced = outs.empty() ? detail::cat(name, " #", seq)
                                : detail::cat(name, " #", seq, " ", outs[0].sizes(), " ", outs[0].scalar_type());
      log::write(log::Level::Trace, rank_, detail::cat(op->traced, ": issued", async_op ? " (async)" : ""));
    }
    // Runs while the queue holds the op's Work (or run_claimed's caller does): `q` outlives it.
    task = [this, q = op.get()] {
      if (q->run) {
        run_op(q->op_name(), q->seq(), q->timeout, q->traced, q->run);
      } else {
        run_op(q->op_name(), q->seq(), q->timeout, q->traced,
               [&](const OpContext& ctx, const Deadline& dl) { q->body(*algo_, ctx, dl); });
      }
    };
    work = std::move(op);
    // Claiming or queueing under mu_ keeps queue order equal to sequence order; the op itself
    // runs without mu_, so other threads can issue ops (they queue behind it) meanwhile.
    // (Not for CUDA ops: the caller's thread only queues them, and its stream waits for them.)
    // In a group of one an async op runs here too (nothing can keep it waiting) and returns
    // completed. In larger groups it never runs at its call: the caller may go on to ops of other
    // groups, in an order that differs from rank to rank (torch allows that), and an op run here
    // would block it until the peers reach this group's op, which they may do only after this
    // rank has reached theirs. Its wait() runs it instead, if the progress thread has not started
    // it (and the progress thread is not even woken for it while the group's callers wait
    // promptly).
    const bool inline_ok = !on_cuda && (!async_op || size_ == 1);
    claimed = inline_ok && queue_.try_claim();
    if (!claimed) {
      if (!on_cuda) work->run_on_wait();
      // An async host op may wait for its wait() to run it (see OpQueue::push).
      queue_.push(work, task, /*deferrable=*/async_op && !on_cuda, issued_at);
    }
  } catch (...) {
    // Never issued: later ops keep the numbers the other ranks give them.
    --next_seq_;
    if (recorded) flight_->withdraw(seq);
    throw;
  }
  if (claimed) {
    lock.unlock();
    queue_.run_claimed(work, task);  // the op's own failure is its Work's, not thrown
    return work;
  }
  if (queue_.on_progress_thread()) {
    // Issued by a future callback: run it (after the ops queued before it) before returning, or
    // a callback that waits for its future would wait for its own thread.
    lock.unlock();
    queue_.run_queued_here_until(*work);
  }
  return work;
}

bool RingBackend::allreduce_inline(const at::Tensor& t, DType d, const Reduction& red,
                                   std::chrono::milliseconds timeout, uint64_t* issued_seq,
                                   std::exception_ptr* error) {
  const char* name = "allreduce";
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(dense_cpu(t) && !red.premul);  // the callers' checks
  std::unique_lock<std::mutex> lock(mu_);
  if (!queue_.try_claim()) return false;
  const uint64_t seq = next_seq_++;
  if (issued_seq != nullptr) *issued_seq = seq;
  const std::chrono::milliseconds limit = timeout == c10d::kUnsetTimeout ? timeout_ : timeout;
  // One clock read for its issue, its start and its deadline. The issue is recorded under mu_,
  // which serializes the group's issue records as the flight recorder needs; nothing here throws,
  // so nothing can leave the claim held.
  const Clock::time_point now = Clock::now();
  if (flight_->capacity() != 0) {
    flight_->issued_running(seq, name, shapes_of(t), c10::toString(t.scalar_type()), now);
  }
  lock.unlock();
  auto run = [&] {
    std::string traced;
    if (log::enabled(log::Level::Trace)) {
      traced = detail::cat(name, " #", seq, " ", t.sizes(), " ", t.scalar_type());
      log::write(log::Level::Trace, rank_, detail::cat(traced, ": issued"));
    }
    run_op(
        name, seq, limit, traced,
        [&](const OpContext& ctx, const Deadline& dl) {
          algo_->allreduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), d, red.op,
                           red.divisor, ctx, dl);
        },
        now);
  };
  if (error == nullptr) {
    queue_.run_claimed(run);
  } else {
    try {
      queue_.run_claimed(run);
    } catch (...) {
      *error = std::current_exception();  // the op's own failure, as a Work would carry it
    }
  }
  return true;
}

}  // namespace ringreduce

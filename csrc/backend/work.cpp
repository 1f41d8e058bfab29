#include "backend/work.h"

#include <ATen/core/grad_mode.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include "backend/op_queue.h"
#include "common/error.h"

namespace ringreduce {

RingWork::RingWork(int rank, c10d::OpType type, const char* op_name, uint64_t seq,
                   std::vector<at::Tensor> outputs, std::shared_ptr<QueueState> queue,
                   std::vector<c10::Device> devices)
    : c10d::Work(rank, type),
      op_name_(op_name),
      seq_(seq),
      rank_(rank),
      outputs_(std::move(outputs)),
      queue_(std::move(queue)),
      progress_thread_(queue_->thread_id),
      devices_(std::move(devices)) {}

namespace {

void settle(c10::ivalue::Future& f, const std::vector<at::Tensor>& outputs, std::exception_ptr error) {
  if (error) {
    f.setError(error);
  } else {
    f.markCompleted(c10::IValue(outputs));
  }
}

}  // namespace

bool RingWork::wait(std::chrono::milliseconds timeout) {
  // (A load first: the exchange, an atomic read-modify-write, only where there is a time to note.)
  if (timeout == kNoTimeout && pushed_at_ns_.load(std::memory_order_relaxed) != 0) {
    if (const int64_t ns = pushed_at_ns_.exchange(0, std::memory_order_relaxed)) {
      using Clock = std::chrono::steady_clock;
      note_wait(*queue_, Clock::time_point(Clock::duration(ns)));
    }
  }
  if (std::this_thread::get_id() == progress_thread_) {
    // A future callback waiting for an op of its group: run the queue here rather than wait for
    // the thread we are on.
    run_queued_here_until(*queue_, *this);
  } else if (run_on_wait_ && timeout == kNoTimeout && !ended_.load(std::memory_order_acquire)) {
    // An async op waited for before the progress thread took it (the functional collectives,
    // `work = all_reduce(..., async_op=True); work.wait()`): this thread runs it, after what was
    // queued before it, as a synchronous op runs. The thread hand-off would cost more than a
    // small op itself. With a timeout the op is left to the progress thread, so that the wait can
    // end at it.
    at::NoGradGuard no_grad;  // as on the progress thread
    run_queued_here_until(*queue_, *this);
  } else if (run_on_wait_ && !isCompleted()) {
    start_now(*queue_, *this);  // left to the progress thread: a deferred op starts now
  }
  if (!ended_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [this] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat(op_prefix(op_name_, seq_, rank_),
                                  "Timed out in Work.wait after ", timeout.count(),
                                  " ms; the op is still running and keeps its own deadline"));
    }
  }
  // Set before completed_ (finish) and ended_ (its release store, or the lock above): read safely.
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> RingWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> f;
  bool settle_here;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), devices_);
      settle_here = done_;  // complete() has run and found no future: it is ours to complete
    } else {
      settle_here = false;
    }
    f = future_;
  }
  // Outside the lock: completing runs the future's callbacks, which may call back into this Work.
  if (settle_here) {
    std::exception_ptr error = error_;
    std::vector<at::Tensor> outputs;
    if (!error) {
      try {
        outputs = output_list();
      } catch (...) {
        error = as_dist_error(std::current_exception());
      }
    }
    settle(*f, outputs, error);
  } else if (run_on_wait_) {
    start_now(*queue_, *this);  // whoever waits on the future does not run a deferred op
  }
  return f;
}

int RingWork::sourceRank() const {
  const int r = source_rank_.load();
  if (r < 0) {
    C10_THROW_ERROR(DistBackendError,
                    detail::cat(op_prefix(op_name_, rank_),
                                "sourceRank() is only known for a completed receive"));
  }
  return r;
}

void RingWork::refer_to(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(outputs_.empty());
  referred_.emplace(t.getIntrusivePtr());
}

std::vector<at::Tensor> RingWork::output_list() const {
  if (!referred_) return outputs_;
  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl = referred_->lock();
  RR_CHECK(impl.defined(), op_prefix(op_name_, seq_, rank_),
           "its tensor no longer exists: the Work of a synchronous op refers to the caller's "
           "tensor without keeping it alive (keep the tensor, or pass asyncOp=True)");
  return {at::Tensor(std::move(impl))};
}

std::vector<at::Tensor> RingWork::result() {
  try {
    return output_list();
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, e.what());
  }
}

void RingWork::complete(std::exception_ptr error) {
  pins_.reset();
  release_op();
  // The future first, then the Work: whoever returns from wait() may read the future's value at
  // once (torch's own backends order it the same way). Its callbacks run here, on this thread.
  c10::intrusive_ptr<c10::ivalue::Future> f;
  {
    std::lock_guard<std::mutex> lock(future_mu_);
    done_ = true;
    error_ = error;
    f = future_;  // null: nobody has asked for it, and getFuture() will complete it when asked
  }
  if (f) settle(*f, outputs_, error);
  finish(error);
  ended_.store(true, std::memory_order_release);
}

void RingWork::complete_unshared(std::exception_ptr error) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(!future_ && !pins_ && !ended_.load());
  // What complete() and c10d::Work::finish() set (the base class made no profiling callback: no
  // title was given), published to other threads by the Work's hand-over to the caller.
  done_ = true;
  error_ = error;
  completed_ = true;
  exception_ = std::move(error);
  ended_.store(true, std::memory_order_relaxed);
}

std::exception_ptr as_dist_error(std::exception_ptr e) {
  std::string msg;
  try {
    std::rethrow_exception(e);
  } catch (const c10::DistBackendError&) {
    return e;
  } catch (const c10::Error& err) {
    msg = err.what_without_backtrace();
  } catch (const std::exception& err) {
    msg = err.what();
  } catch (...) {
    msg = "ringreduce: unknown error";
  }
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace ringreduce

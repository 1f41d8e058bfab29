#include "backend/op_queue.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "common/error.h"

namespace ringreduce {

OpQueue::OpQueue() : thread_([this] { loop(); }) {}

OpQueue::~OpQueue() { drain(); }

void OpQueue::push(c10::intrusive_ptr<RingWork> work, std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RR_CHECK(!stopping_, "ringreduce ", work->op_name(), " #", work->seq(),
             ": the process group has been shut down");
    tasks_.push_back(Task{std::move(work), std::move(body)});
  }
  cv_.notify_one();
}

bool OpQueue::try_claim() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || running_ || !tasks_.empty()) return false;
  running_ = true;
  return true;
}

void OpQueue::run_claimed(const c10::intrusive_ptr<RingWork>& work,
                          const std::function<void()>& body) {
  at::NoGradGuard no_grad;
  run_and_complete(work, body);
}

void OpQueue::run_queued_here_until(const RingWork& work) {
  while (!const_cast<RingWork&>(work).isCompleted()) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Another thread may be running a claimed (inline) op: ops never overlap.
      cv_.wait(lock, [this] { return !running_; });
      if (tasks_.empty()) return;  // `work` is being completed by the thread that ran it
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    run_and_complete(task.work, task.body);
  }
}

void OpQueue::run_and_complete(const c10::intrusive_ptr<RingWork>& work,
                               const std::function<void()>& body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = as_dist_error(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_all();  // ops that arrived meanwhile may run now
  work->complete(error);
}

void OpQueue::drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  join();
}

void OpQueue::cancel(const std::string& why) {
  std::deque<Task> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    orphans.swap(tasks_);
  }
  cv_.notify_all();
  for (auto& t : orphans) {
    t.work->complete(as_dist_error(std::make_exception_ptr(
        Error(detail::cat("ringreduce ", t.work->op_name(), " #", t.work->seq(),
                          ": cancelled before it ran: ", why)))));
  }
  join();
}

void OpQueue::join() {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void OpQueue::loop() {
  // Collectives write into tensors that may require grad (DDP's buckets, parameters): autograd
  // must not see these writes, as with every other backend.
  at::NoGradGuard no_grad;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !running_ && (stopping_ || !tasks_.empty()); });
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    run_and_complete(task.work, task.body);
  }
}

}  // namespace ringreduce

#include "backend/op_queue.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "common/error.h"

namespace ringreduce {

namespace {

// Runs body, ends the claim, then completes the Work: its future's callbacks may issue further
// ops on this group, which must then find the queue free.
void run_and_complete(QueueState& st, const c10::intrusive_ptr<RingWork>& work,
                      c10::function_ref<void()> body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = as_dist_error(std::current_exception());
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.running = false;
    // Only when somebody can go on: a wake-up of the idle progress thread after every inline op
    // would cost a context switch per op on a core the ranks need (on 2 cores, about a third of
    // a small all-reduce's time).
    wake = st.stopping || !st.tasks.empty() || st.idle_waiters > 0;
  }
  if (wake) st.cv.notify_all();  // ops that arrived meanwhile may run now
  work->complete(error);
}

void fail_all(std::deque<QueueState::Task>& tasks, const std::string& why) {
  for (auto& t : tasks) {
    t.work->complete(as_dist_error(std::make_exception_ptr(
        Error(detail::cat("ringreduce ", t.work->op_name(), " #", t.work->seq(),
                          ": cancelled before it ran: ", why)))));
  }
}

void loop(const std::shared_ptr<QueueState>& st) {
  // Collectives write into tensors that may require grad (DDP's buckets, parameters): autograd
  // must not see these writes, as with every other backend.
  at::NoGradGuard no_grad;
  for (;;) {
    QueueState::Task task;
    {
      std::unique_lock<std::mutex> lock(st->mu);
      auto ready = [&] { return !st->running && (st->stopping || !st->tasks.empty()); };
      while (!st->cv.wait_for(lock, kIdlePoll, ready)) {
        if (st->idle && !st->running) st->idle();
      }
      if (st->tasks.empty()) return;  // stopping, nothing left
      task = std::move(st->tasks.front());
      st->tasks.pop_front();
      st->running = true;
    }
    run_and_complete(*st, task.work, task.body);
  }
}

}  // namespace

void run_queued_here_until(QueueState& st, const RingWork& work) {
  while (!const_cast<RingWork&>(work).isCompleted()) {
    QueueState::Task task;
    {
      std::unique_lock<std::mutex> lock(st.mu);
      // Another thread may be running a claimed (inline) op: ops never overlap.
      ++st.idle_waiters;
      st.cv.wait(lock, [&] { return !st.running; });
      --st.idle_waiters;
      if (st.tasks.empty()) return;  // `work` is being completed by the thread that ran it
      task = std::move(st.tasks.front());
      st.tasks.pop_front();
      st.running = true;
    }
    run_and_complete(st, task.work, task.body);
  }
}

OpQueue::OpQueue() : st_(std::make_shared<QueueState>()) {
  thread_ = std::thread([st = st_] { loop(st); });
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->thread_id = thread_.get_id();
}

OpQueue::~OpQueue() { drain(); }

void OpQueue::set_idle(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->idle = std::move(fn);
}

void OpQueue::push(c10::intrusive_ptr<RingWork> work, std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    RR_CHECK(!st_->stopping, "ringreduce ", work->op_name(), " #", work->seq(),
             ": the process group has been shut down");
    st_->tasks.push_back(QueueState::Task{std::move(work), std::move(body)});
  }
  st_->cv.notify_one();
}

bool OpQueue::try_claim() {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (st_->stopping || st_->running || !st_->tasks.empty()) return false;
  st_->running = true;
  return true;
}

void OpQueue::run_claimed(const c10::intrusive_ptr<RingWork>& work,
                          c10::function_ref<void()> body) {
  at::NoGradGuard no_grad;
  run_and_complete(*st_, work, body);
}

bool OpQueue::busy() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->running || !st_->tasks.empty();
}

void OpQueue::drain() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stopping = true;
  }
  st_->cv.notify_all();
  join();
}

void OpQueue::cancel(const std::string& why) {
  std::deque<QueueState::Task> orphans;
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stopping = true;
    orphans.swap(st_->tasks);
  }
  st_->cv.notify_all();
  fail_all(orphans, why);
  join();
}

void OpQueue::join() {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
    return;
  }
  // Destroyed or shut down from a future callback, on the progress thread: it cannot join itself.
  // What is still queued would run against a group that is going away, so it fails; the thread
  // finishes the callback and exits, holding only the shared state.
  std::deque<QueueState::Task> orphans;
  {
    std::lock_guard<std::mutex> state_lock(st_->mu);
    orphans.swap(st_->tasks);
  }
  fail_all(orphans, "the process group was shut down from one of its own callbacks");
  thread_.detach();
}

}  // namespace ringreduce

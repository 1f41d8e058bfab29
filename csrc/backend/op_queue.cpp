#include "backend/op_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include "common/error.h"
#include "transport/wait.h"

namespace ringreduce {

namespace {

// A wait() this soon after its op's call counts as prompt, and this many in a row make the queue
// prompt again (see OpQueue::push). Generous beside the 1-5 us a waiting caller takes, so that a
// caller the scheduler held up for a moment still counts.
constexpr std::chrono::microseconds kPromptGap{50};
constexpr int kPromptStreak = 4;

}  // namespace

QueueState::QueueState() {
  bell_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  RR_CHECK(bell_fd >= 0, "ringreduce: eventfd for the op queue failed: ", std::strerror(errno));
  timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (timer_fd < 0) {
    const int e = errno;
    ::close(bell_fd);
    RR_CHECK(false, "ringreduce: timerfd for the op queue failed: ", std::strerror(e));
  }
}

QueueState::~QueueState() {
  ::close(bell_fd);
  ::close(timer_fd);
}

void QueueState::ring() {
  const uint64_t one = 1;
  // Only EAGAIN can fail it: the counter is full, and a wake-up is pending anyway.
  [[maybe_unused]] const ssize_t n = ::write(bell_fd, &one, sizeof(one));
}

namespace {

// Under `mu`: the timer fires `after` from now. It is armed at most once per delay and never
// disarmed: setting a timer costs microseconds in a VM (a short one reprograms the CPU's timer,
// a trap to the hypervisor), as much as the hand-off that deferring saves, so an op run by its
// waiter leaves it armed, and a firing that finds nothing due only puts the thread back to sleep.
void arm_timer(QueueState& st, std::chrono::nanoseconds after) {
  itimerspec t{};
  const int64_t ns = std::max<int64_t>(after.count(), 1000);
  t.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
  t.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
  if (::timerfd_settime(st.timer_fd, 0, &t, nullptr) == 0) {
    st.timer_armed = true;
  } else {
    // No timer: nothing may be left waiting on one; the thread looks at the queue now.
    if (!st.tasks.empty()) st.tasks.front().deferred_at = {};
    st.ring();
  }
}

// Under `mu`, when the timer has fired. If it finds no deferred op waiting longer than a prompt
// caller takes to reach its wait() (or than the delay in force, where that is shorter), every op
// deferred since the timer was armed has started without it (by its wait(), an op queued behind
// it, its future or a wait with a timeout), and the delay in force doubles. One that has waited
// longer keeps the delay it was deferred under: front_may_start starts it once that has passed
// (and resets the delay).
void grow_if_quiet(QueueState& st) {
  if (!st.prompt) return;
  if (!st.tasks.empty()) {
    const QueueState::Task& front = st.tasks.front();
    const QueueState::Clock::duration young = std::min<QueueState::Clock::duration>(kPromptGap, st.defer_delay);
    if (front.deferred_at != QueueState::Clock::time_point{} &&
        QueueState::Clock::now() - front.deferred_at >= young) {
      return;
    }
  }
  st.defer_delay = std::min(st.defer_delay * 2, st.start_delay * kDeferGrowth);
}

// Sleeps until the bell rings, the timer fires or `at_most` passes; false if it timed out.
bool sleep_for_ops(QueueState& st, std::chrono::milliseconds at_most) {
  pollfd fds[2] = {{st.bell_fd, POLLIN, 0}, {st.timer_fd, POLLIN, 0}};
  const int n = ::poll(fds, 2, static_cast<int>(at_most.count()));
  if (n <= 0) return n < 0;  // timed out (EINTR: the caller looks at the queue again)
  uint64_t count;
  if (fds[0].revents & POLLIN) {
    [[maybe_unused]] const ssize_t r = ::read(st.bell_fd, &count, sizeof(count));
  }
  if (fds[1].revents & POLLIN) {
    [[maybe_unused]] const ssize_t r = ::read(st.timer_fd, &count, sizeof(count));
    std::lock_guard<std::mutex> lock(st.mu);
    st.timer_armed = false;
    grow_if_quiet(st);
  }
  return true;
}

// Under `mu`, on the progress thread: whether the queue's front op may start. A deferred one
// whose delay has passed starts, and its caller is no longer taken for a prompt one; one whose
// delay has not passed keeps the timer armed for the rest.
bool front_may_start(QueueState& st) {
  QueueState::Task& front = st.tasks.front();
  if (front.deferred_at == QueueState::Clock::time_point{}) return true;
  const auto age = QueueState::Clock::now() - front.deferred_at;
  if (age >= st.defer_delay) {
    front.deferred_at = {};
    st.prompt = false;
    st.prompt_streak = 0;
    st.defer_delay = st.start_delay;
    return true;
  }
  if (!st.timer_armed) arm_timer(st, st.defer_delay - age);
  return false;
}

// Runs body, ends the claim, then completes the Work: its future's callbacks may issue further
// ops on this group, which must then find the queue free.
// Runs the op that holds `running`, then lets the next one go; returns its error, as the Work
// would carry it.
std::exception_ptr run_and_release(QueueState& st, c10::function_ref<void()> body) {
  std::exception_ptr error;
  try {
    body();
  } catch (...) {
    error = as_dist_error(std::current_exception());
  }
  bool ring, wake;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.running = false;
    // Only when somebody can go on: a wake-up of the idle progress thread after every inline op
    // would cost a context switch per op on a core the ranks need (on 2 cores, about a third of
    // a small all-reduce's time).
    ring = st.stopping || !st.tasks.empty();
    wake = ring || st.idle_waiters > 0;
  }
  // Ops that arrived meanwhile may run now: on the progress thread, or on a thread waiting for
  // `running` to drop (run_queued_here_until).
  if (ring) st.ring();
  if (wake) st.cv.notify_all();
  return error;
}

void run_and_complete(QueueState& st, const c10::intrusive_ptr<RingWork>& work,
                      c10::function_ref<void()> body) {
  work->complete(run_and_release(st, body));
}

void fail_all(std::deque<QueueState::Task>& tasks, const std::string& why) {
  for (auto& t : tasks) {
    t.work->complete(as_dist_error(std::make_exception_ptr(
        Error(detail::cat(op_prefix(t.work->op_name(), t.work->seq(), t.work->rank()),
                          "cancelled before it ran: ", why)))));
  }
}

void loop(const std::shared_ptr<QueueState>& st) {
  // Collectives write into tensors that may require grad (DDP's buckets, parameters): autograd
  // must not see these writes, as with every other backend.
  at::NoGradGuard no_grad;
  // Its ops overlap with the caller's work: its waits keep the fixed spin (transport/wait.h).
  t_background_waiter = true;
  for (;;) {
    QueueState::Task task;
    {
      std::unique_lock<std::mutex> lock(st->mu);
      auto ready = [&] {
        return !st->running && (st->stopping || (!st->tasks.empty() && front_may_start(*st)));
      };
      while (!ready()) {
        lock.unlock();
        const bool woken = sleep_for_ops(*st, kIdlePoll);
        lock.lock();
        if (!woken && st->idle && !st->running) st->idle();
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
  // ended(), not isCompleted(), which takes the Work's lock while the Work has not ended, as at
  // every wait() that runs a deferred op here.
  while (!work.ended()) {
    QueueState::Task task;
    {
      std::unique_lock<std::mutex> lock(st.mu);
      // Only the ops up to `work`, and only while it is still queued: once another thread has
      // taken it, the ops behind it are not this caller's to run, nor to wait for. Running one,
      // or waiting for the thread that took it to finish it, would keep the caller from its next
      // op of another group, which a peer may need before it issues this group's next op
      // (test_a_wait_runs_no_op_queued_after_its_own).
      bool queued = true;
      auto look = [&] {
        queued = std::any_of(st.tasks.begin(), st.tasks.end(),
                             [&](const QueueState::Task& t) { return t.work.get() == &work; });
        return !st.running || !queued;
      };
      // Another thread may be running a claimed (inline) op: ops never overlap.
      ++st.idle_waiters;
      st.cv.wait(lock, look);
      --st.idle_waiters;
      if (!queued) return;  // taken by another thread, which completes it
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

void start_now(QueueState& st, const RingWork& work) {
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.tasks.empty() || st.tasks.front().work.get() != &work) return;
    if (st.tasks.front().deferred_at == QueueState::Clock::time_point{}) return;
    st.tasks.front().deferred_at = {};
  }
  st.ring();
}

void note_wait(QueueState& st, QueueState::Clock::time_point pushed_at) {
  const bool soon = QueueState::Clock::now() - pushed_at < kPromptGap;
  std::lock_guard<std::mutex> lock(st.mu);
  if (!soon) {
    st.prompt_streak = 0;
  } else if (++st.prompt_streak >= kPromptStreak) {
    st.prompt = true;
  }
}

void OpQueue::set_start_delay(std::chrono::microseconds d) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->start_delay = d;
  st_->defer_delay = d;
}

void OpQueue::push(c10::intrusive_ptr<RingWork> work, std::function<void()> body, bool deferrable,
                   QueueState::Clock::time_point issued_at) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    RR_CHECK(!st_->stopping, op_prefix(work->op_name(), work->seq(), work->rank()),
             "the process group has been shut down");
    const bool idle = !st_->running && st_->tasks.empty();
    const bool defer = deferrable && idle && st_->prompt && st_->start_delay.count() > 0;
    if (deferrable && issued_at == QueueState::Clock::time_point{}) issued_at = QueueState::Clock::now();
    if (deferrable && !defer) work->set_pushed_at(issued_at);  // for note_wait
    st_->tasks.push_back(QueueState::Task{std::move(work), std::move(body)});
    if (st_->running) {
      // The running op's end starts this one (run_and_complete, or the thread's own loop).
    } else if (defer) {
      st_->tasks.back().deferred_at = issued_at;
      if (!st_->timer_armed) arm_timer(*st_, st_->defer_delay);
    } else {
      // Queued behind a deferred op, its caller issues several before it waits: both start now.
      st_->tasks.front().deferred_at = {};
      wake = true;
    }
  }
  if (wake) st_->ring();
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

void OpQueue::run_claimed(c10::function_ref<void()> body) {
  if (std::exception_ptr error = run_and_release(*st_, body)) std::rethrow_exception(error);
}

bool OpQueue::busy() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->running || !st_->tasks.empty();
}

void OpQueue::finish_queued() {
  for (;;) {
    QueueState::Task task;
    {
      std::unique_lock<std::mutex> lock(st_->mu);
      ++st_->idle_waiters;
      st_->cv.wait(lock, [&] { return !st_->running; });
      --st_->idle_waiters;
      if (st_->tasks.empty()) return;
      task = std::move(st_->tasks.front());
      st_->tasks.pop_front();
      st_->running = true;
    }
    run_and_complete(*st_, task.work, task.body);
  }
}

void OpQueue::drain() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stopping = true;
  }
  st_->ring();
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
  st_->ring();
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

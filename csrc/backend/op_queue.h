// The per-group op queue and its progress thread.
//
// Ops run one at a time in the order they were issued. Every rank issues a group's ops in the same
// order (torch.distributed's contract), so every rank runs them in the same order too, which is
// what lets the ring match messages by position instead of by tag.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <c10/util/FunctionRef.h>

#include "backend/work.h"

namespace ringreduce {

// What the queue, its progress thread and its Works share. The thread holds its own reference: a
// group destroyed from one of its own future callbacks is destroyed on that thread, which cannot
// join itself, so the thread finishes the callback and exits touching nothing but this.
struct QueueState {
  using Clock = std::chrono::steady_clock;
  struct Task {
    c10::intrusive_ptr<RingWork> work;
    std::function<void()> body;
    // Set while the op is deferred (OpQueue::push): left for its wait() to run since then.
    Clock::time_point deferred_at{};
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> tasks;
  bool running = false;   // an op is running, on the progress thread or inline
  bool stopping = false;  // no more pushes; the thread exits once `tasks` is empty
  int idle_waiters = 0;   // threads waiting for `running` to drop, whatever is queued
  std::thread::id thread_id;
  // The progress thread sleeps on these two, not on `cv` (which wakes the other waiters): the
  // bell is rung for queued ops to run now; the timer wakes it to start a deferred op whose
  // caller has not waited for it. Both are the state's: the thread may outlive the OpQueue.
  int bell_fd = -1;
  int timer_fd = -1;
  bool timer_armed = false;  // set when armed, cleared when the thread reads its expiry
  // How long a deferred op is left for its wait() at first (RINGREDUCE_ASYNC_START_US; 0: never
  // deferred), and the delay in force: it doubles each time the timer fires and finds every op
  // deferred since it was armed started without it (grow_if_quiet), up to kDeferGrowth times
  // start_delay, and drops back to start_delay when a deferred op's caller did not start it in
  // time. Each firing wakes the progress thread on a core the ranks are using; at a fixed 1 ms,
  // those wake-ups cost a small async op about a tenth of its time at world 2 (docs/results.md),
  // while a caller that has waited promptly all along is unlikely to stop now, and if it does,
  // the delay it meets is still bounded.
  std::chrono::microseconds start_delay{1000};
  std::chrono::microseconds defer_delay{1000};
  // The caller waits for its async ops right after the call (see OpQueue::push): learned from
  // the last ops, and dropped when a deferred op's caller did not wait for it in time.
  bool prompt = true;
  int prompt_streak = 0;
  // Called (under `mu`) about every kIdlePoll while the thread has nothing to run: the group
  // looks there for an abort raised by a peer while this rank was not in an op.
  std::function<void()> idle;

  QueueState();
  ~QueueState();
  QueueState(const QueueState&) = delete;
  QueueState& operator=(const QueueState&) = delete;
  // Wakes the progress thread. Needs no lock: the bell counts, so no ring is lost.
  void ring();
};

// A waiter that will not run a deferred op itself (a wait with a timeout, a future's): the progress
// thread starts it now.
void start_now(QueueState& st, const RingWork& work);
// A wait() without a timeout reached an async op pushed at `pushed_at` (while the queue was not
// prompt): how soon it came after the call teaches the queue whether to defer the next ones.
void note_wait(QueueState& st, QueueState::Clock::time_point pushed_at);

constexpr std::chrono::milliseconds kIdlePoll{100};
// How far QueueState::defer_delay grows past start_delay.
constexpr int kDeferGrowth = 8;

// Future callbacks run on the progress thread. One that issues an op on this group and waits for
// it (PowerSGD's hook does) would wait for an op queued behind itself. So on the progress thread
// an op is not left to the queue: this runs the queued ops here, in issue order, up to and with
// `work`. It returns once `work` has ended, or once another thread has taken `work` (whose
// waiter then waits for the Work): the ops queued behind `work` are never run here.
void run_queued_here_until(QueueState& st, const RingWork& work);

class OpQueue {
 public:
  OpQueue();
  ~OpQueue();  // drain()

  // Runs `body` on the progress thread after everything queued before it, then completes `work`
  // with its outcome. Throws if the queue was shut down.
  //
  // `deferrable`: an async host op, which its wait() runs if it has not started
  // (RingWork::run_on_wait). Waking the progress thread for it and then waiting for that thread
  // costs about as much as a small op itself, and most callers wait right after the call
  // (`all_reduce(..., async_op=True).wait()`, the functional collectives' wait_tensor). So while the
  // queue has seen its async ops waited for promptly, one pushed onto an idle queue is deferred:
  // the thread is not woken, and the caller's wait() runs it. It starts on the thread all the
  // same when a second op is queued behind it, when its future is asked for, at a wait() with a
  // timeout, or, if none of these comes, after the delay in force (QueueState::defer_delay), by a
  // timer, which also tells the queue that this caller overlaps its ops with its work: its next
  // ones go to the thread at once.
  // `issued_at`: the op's issue, on QueueState::Clock (the steady clock); {}: now.
  void push(c10::intrusive_ptr<RingWork> work, std::function<void()> body, bool deferrable = false,
            QueueState::Clock::time_point issued_at = {});
  void set_start_delay(std::chrono::microseconds d);

  // For a synchronous op (the caller waits right away) the caller may run it on its own thread,
  // which saves the two thread hand-offs that dominate small ops. try_claim() succeeds when
  // nothing is queued or running, and makes later pushes wait; the caller then runs the op with
  // run_claimed(), which ends the claim before completing the Work.
  bool try_claim();
  // (A function_ref: an op run here is never stored, so it needs no std::function of its own.)
  void run_claimed(const c10::intrusive_ptr<RingWork>& work, c10::function_ref<void()> body);
  // The same for an op that no Work tracks (RingBackend::allreduce_inline's): its error, as a Work
  // would carry it, is thrown here. Its body reaches its tensors through raw pointers only, which
  // autograd never sees, so it runs without the NoGradGuard the other forms set up (two reads
  // and writes of torch's thread-local autograd state, a tenth of the inline op's own code).
  void run_claimed(c10::function_ref<void()> body);

  void run_queued_here_until(const RingWork& work) { ringreduce::run_queued_here_until(*st_, work); }
  // Sets QueueState::idle; set it to null before what it points at goes away (it is called under
  // the same lock, so once this returns it is not running).
  void set_idle(std::function<void()> fn);
  bool on_progress_thread() const { return std::this_thread::get_id() == st_->thread_id; }
  const std::shared_ptr<QueueState>& state() const { return st_; }

  // An op is running or queued.
  bool busy() const;
  // Runs the queued ops on the calling thread (as a wait() would), after the running one: on
  // return, every op queued before the call has ended.
  void finish_queued();

  // Stops taking ops, lets the queued ones run (each keeps its own deadline) and joins the thread.
  // Idempotent. On the progress thread itself (from a callback) the queued ops fail instead.
  void drain();
  // Stops taking ops, fails the queued ones with `why`, waits for the running one (abort the
  // transport first so that it ends promptly) and joins the thread. Idempotent.
  void cancel(const std::string& why);

 private:
  void join();

  std::shared_ptr<QueueState> st_;
  std::mutex join_mu_;  // drain() and cancel() may race (abort from another thread)
  std::thread thread_;
};

}  // namespace ringreduce

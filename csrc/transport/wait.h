// How a transport waits, in one place: the mechanics (a 32-bit counter to sleep on, spinning
// first) and the deadline policy every wait follows (PeerWait).
//
// The machines we run on can have more ranks than cores (4 ranks on 2 cores in CI), so a rank that
// spins while its peer needs the core slows the peer down. A wait spins for a short, configurable
// time (a hand-off between two running ranks is then a few hundred nanoseconds), then sleeps in
// the kernel until the writer wakes it (a futex over shared memory, a condition variable over
// TCP). Every sleep is bounded by kMaxSleep so that deadlines, aborts and dead peers are noticed
// even when no wake-up comes.
//
// Shared memory and TCP wait this way; CUDA IPC waits through the shared-memory transport that
// carries its control.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "transport/transport.h"

namespace ringreduce {

// A wait re-checks its deadline, the group's abort and its peer's liveness at least this often.
constexpr std::chrono::milliseconds kMaxSleep{100};

// The counter a waiter sleeps on, with the number of sleepers beside it so that a writer only
// makes the wake-up system call when somebody is actually asleep. Both live in shared memory.
struct WaitWord {
  std::atomic<uint32_t> value{0};
  std::atomic<uint32_t> sleepers{0};
};

namespace futex {
// Sleep while *word == expected, at most `timeout`. Returns on wake-up, timeout, a changed value or
// a signal; callers re-check their condition in a loop.
void wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout);
void wake_all(std::atomic<uint32_t>* word);
}  // namespace futex

// Publish a new value and wake sleepers. The seq_cst store followed by a seq_cst load of
// `sleepers` pairs with the waiter's increment-then-load in wait_for(): one of the two always sees
// the other, so a wake-up cannot be lost.
inline void publish(WaitWord& w, uint32_t v) {
  w.value.store(v, std::memory_order_seq_cst);
  if (w.sleepers.load(std::memory_order_seq_cst) != 0) futex::wake_all(&w.value);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Adds one to `w` (a doorbell) and wakes its sleepers.
inline void bump(WaitWord& w) {
  w.value.fetch_add(1, std::memory_order_seq_cst);
  if (w.sleepers.load(std::memory_order_seq_cst) != 0) futex::wake_all(&w.value);
}

// How many polls a spin makes between clock reads. A pause lasts 30-40 ns on some x86 CPUs (and
// 140 cycles on others): a clock read every 64 polls made a spin of 1 us last over 2 us. A read
// every 8 costs a few percent of the polls.
constexpr unsigned kPollsPerClockRead = 8;

// How long a waiting rank spins before it sleeps, adapted to how its waits end, between `least`
// and `most` (fixed where most <= least).
//
// A rank that gives up its spin and sleeps pays a wake-up when its peer arrives (50-100 us in a
// VM, where an idle vCPU is halted), and leaves its wait that much behind the peer. Where ranks
// meet every op after a similar stretch of their own work (a compiled caller's 80 us, a decode
// step's layers), the peer then waits as long at the next op, gives up its spin too, and so on:
// every op costs a wake-up. A wait that ends soon after the spin gave up (within kSoonAfter spins)
// and within `most` doubles the spin, up to `most`; any other (the peer was really away: a longer
// spin, or one as long as allowed, would only have burnt the core) halves it, down to `least`. A
// wait that ends within the spin leaves it as it is: spinning stops at the peer's arrival whatever
// the limit. A spin of 0 grows as if it were 1 us.
class AdaptiveSpin {
 public:
  static constexpr int kSoonAfter = 4;

  AdaptiveSpin() = default;
  AdaptiveSpin(std::chrono::nanoseconds least, std::chrono::nanoseconds most)
      : least_(least), most_(std::max(least, most)), now_(least.count()) {}

  std::chrono::nanoseconds now() const { return std::chrono::nanoseconds(now_.load(std::memory_order_relaxed)); }

  // A wait ended after `waited` in all; `slept`: it outlasted the spin (and yielded or slept).
  void record(std::chrono::nanoseconds waited, bool slept) {
    if (!slept || most_ == least_) return;
    const auto cur = now();
    const auto base = std::max<std::chrono::nanoseconds>(cur, std::chrono::microseconds(1));
    const auto next = waited <= kSoonAfter * base && waited <= most_ ? std::min(most_, 2 * base)
                                                                      : std::max(least_, cur / 2);
    now_.store(next.count(), std::memory_order_relaxed);
  }

 private:
  std::chrono::nanoseconds least_{0}, most_{0};
  // Atomic only so that two threads waiting on one transport at once (none do today) would race
  // on a hint, not on undefined behaviour.
  std::atomic<int64_t> now_{0};
};

// Whether this thread waits in the background: a group's progress thread, whose ops overlap with
// its caller's own work (DDP's buckets during backward), maybe on the same core. Its waits keep the
// fixed spin: a spin grown to a millisecond there would take the core from the caller's compute.
inline thread_local bool t_background_waiter = false;

// Polls ready() with a pause between tries for at most `at_most` (none: one try); whether it came
// true.
template <class Ready>
bool spin_until(Ready ready, std::chrono::nanoseconds at_most) {
  if (at_most.count() <= 0) return ready();
  const auto until = Clock::now() + at_most;
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if (i % kPollsPerClockRead == 0 && Clock::now() >= until) return false;
  }
}

// One sleep on `w`, at most `at_most`, while stay(its value) holds. The sleeper is counted first
// and the value read after: pairs with publish() and bump(), so no wake-up is lost.
template <class Stay>
void sleep_on(WaitWord& w, std::chrono::nanoseconds at_most, Stay stay) {
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t v = w.value.load(std::memory_order_seq_cst);
  if (stay(v)) futex::wait(&w.value, v, at_most);
  w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

// The error of an op that found its group aborted: "ringreduce <op> #<seq>: rank r: the group was
// aborted: <why>", and that of a call outside any op (the non-blocking forms).
[[noreturn]] void throw_aborted(const OpContext& op, int rank, const std::string& why);
[[noreturn]] void throw_aborted(int rank, const std::string& why);

// One wait of transport `t` for `peer` in `op`: what ends it when its data does not come, and the
// errors it ends with. Every transport's wait loop asks it, between sleeps of at most nap():
//  - the group was aborted: aborted(why) throws AbortedError;
//  - the peer is known to be gone: peer_gone() aborts the group and throws Error, "ringreduce
//    <op> #<seq>: rank r <verb> rank p (<waiting_for>), <why>";
//  - expired(): timed_out() throws TimeoutError "...: Timed out after T ms waiting for rank p
//    (<waiting_for>)<over>; <who holds the group up>" and aborts the group with it, so the other
//    ranks fail now rather than at their own deadlines, unless another rank's abort came in
//    meanwhile: that was an earlier timeout, which saw more of the chain, and it wins.
// The calls that abort the group take the transport's locks: call them with none held.
class PeerWait {
 public:
  // `view` follows chains of waits and knows the group's abort (the transport's chain_view()).
  PeerWait(Transport& t, Transport& view, int peer, const char* waiting_for, const OpContext& op,
           const Deadline& dl)
      : t_(t), view_(view), peer_(peer), waiting_for_(waiting_for), op_(op), dl_(dl) {}

  bool expired() const { return dl_.passed(); }
  // How long the next sleep may last.
  std::chrono::nanoseconds nap() const {
    return std::min<std::chrono::nanoseconds>(dl_.remaining(), kMaxSleep);
  }
  [[noreturn]] void aborted(const std::string& why) const { throw_aborted(op_, t_.rank(), why); }
  [[noreturn]] void peer_gone(const char* verb, const std::string& why) const;
  // `over` names the link where that helps (" over TCP").
  [[noreturn]] void timed_out(const char* over) const;

 private:
  Transport& t_;
  Transport& view_;
  int peer_;
  const char* waiting_for_;
  const OpContext& op_;
  const Deadline& dl_;
};

}  // namespace ringreduce

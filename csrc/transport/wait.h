// Waiting on a 32-bit counter in shared memory: spin briefly, then sleep on a futex.
//
// The machines we run on can have more ranks than cores (4 ranks on 2 cores in CI), so a rank that
// spins while its peer needs the core slows the peer down. We spin for a short, configurable time
// (a hand-off between two running ranks is then a few hundred nanoseconds), then sleep in the
// kernel until the writer wakes us. Every sleep is bounded so deadlines and aborts are noticed.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ringreduce {

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

}  // namespace ringreduce

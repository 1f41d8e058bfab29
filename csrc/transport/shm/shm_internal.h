// What the files of ShmTransport share (shm_transport.cpp: set-up, the FIFOs, the waits;
// shm_window.cpp: the window ops): the layout of a rank's segment and the wait every op's
// hand-off goes through. Internal to csrc/transport/shm/.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shm/shm_transport.h"
#include "transport/wait.h"

namespace ringreduce {

namespace shm {

constexpr uint64_t kMagic = 0x7272696e67726564ULL;  // "rringred"
constexpr size_t kPage = 4096;
// Window ops smaller than this do not move through the window (ShmTransport::begin).
constexpr size_t kWindowMoveMinBytes = 4096;
constexpr size_t kSlotHeaderBytes = 64;  // MsgHeader, padded so payloads start 64-byte aligned
constexpr size_t kReasonBytes = 2048;

inline size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

}  // namespace shm

// At offset 0 of every segment. Written by the owner before it publishes the name, then read-only
// except for the abort fields, which any rank may write.
struct ShmTransport::Segment {
  uint64_t magic;
  uint64_t token;
  uint32_t rank;
  uint32_t world;
  uint64_t slot_bytes;
  uint32_t nslots;
  int32_t pid;  // the owner's process: a waiter that finds it gone knows its peer died
  uint64_t pid_ns;  // the namespace `pid` lives in (pid_namespace())
  uint32_t locked;  // 1: the owner holds a shared lock on the segment for its lifetime
  // Where this rank is, for a peer that times out to find who is really missing: the op it last
  // entered the transport in (seq + 1, 0 before the first) and the peer it sleeps on (-1: none).
  alignas(64) std::atomic<uint64_t> op_seq;
  std::atomic<int32_t> blocked_on;
  // The CPU the owner ran on when it last entered an op or spun in a wait: a peer that finds it
  // equal to its own does not spin for the owner, which cannot run while it does (wait_until).
  std::atomic<int32_t> cpu;
  alignas(64) std::atomic<uint32_t> aborted;      // 1 once `reason` is complete
  std::atomic<uint32_t> abort_claimed;            // first writer of `reason` wins
  char reason[shm::kReasonBytes];
  // Bumped by peers on every message to / slot freed for this rank, where doorbells are on.
  alignas(64) WaitWord doorbell;
  // The window (PeerWindow): phases published by the owner; for its current and previous op
  // (by op count modulo 2), the op's fingerprint and where its region starts in the window area;
  // and whether it waits in a window op now (for a peer that looks for a desync between a window
  // op and a message op).
  alignas(64) WaitWord wstamp;
  alignas(64) MsgHeader whdr[2];
  uint64_t wat[2];
  std::atomic<uint32_t> in_window;
};

// One per (receiver, sender) pair, in the receiver's segment. head is written only by the sender,
// tail only by the receiver; they sit on separate cache lines so the two sides do not false-share.
struct ShmTransport::Fifo {
  alignas(64) WaitWord head;  // messages published by the sender
  alignas(64) WaitWord tail;  // messages released by the receiver
};

template <class Ready, class Check>
void ShmTransport::wait_until(WaitWord& word, Ready ready, int peer, const char* waiting_for,
                              const OpContext& op, const Deadline& dl, Check check) {
  auto now_ready = [&] { return ready(word.value.load(std::memory_order_acquire)); };
  if (now_ready()) return;
  Segment* own = segment(rank_);
  auto is_aborted = [own] { return own->aborted.load(std::memory_order_acquire) != 0; };
  if (is_aborted()) throw_aborted(op);

  // Spin first: when the peer is running, the hand-off is a cache-line transfer away. Unless
  // the scheduler has put the peer on this rank's own CPU (ranks move between CPUs, and a third
  // process that keeps one busy crowds both ranks onto the other): then the peer cannot run while
  // this rank spins, and every spin would cost a whole time slice, so yield it the CPU instead.
  const Segment* ps = segment(peer);
  unsigned polls = 0;
  auto ready_or_yield = [&] {
    if (now_ready()) return true;
    if (++polls % kPollsPerClockRead == 0) {
      // Stored only when it moved: the peer reads this line as often, and a store of the same
      // value would still take the line from it each time.
      const int cpu = sched_getcpu();
      if (own->cpu.load(std::memory_order_relaxed) != cpu) own->cpu.store(cpu, std::memory_order_relaxed);
      if (cpu == ps->cpu.load(std::memory_order_relaxed)) {
        ++yields_to_peer_;
        sched_yield();
      }
    }
    return false;
  };
  const bool adapt = !t_background_waiter;
  const std::chrono::nanoseconds spun = adapt ? spin_.now() : std::chrono::nanoseconds(cfg_.spin);
  if (spin_until(ready_or_yield, spun)) return;
  // The spin ran its whole length: the wait began that long ago (no clock read for the waits the
  // spin catches, the common ones).
  const auto started = Clock::now() - spun;

  // From here on we yield or sleep: say on whom, so a peer that times out can follow the chain.
  // On the way out, tell the spin how long the whole wait took (the caller's waits only).
  own->blocked_on.store(peer, std::memory_order_relaxed);
  struct Unblock {
    Segment* s;
    AdaptiveSpin& spin;
    Clock::time_point started;
    bool adapt;
    ~Unblock() {
      s->blocked_on.store(-1, std::memory_order_relaxed);
      if (adapt) spin.record(Clock::now() - started, true);
    }
  } unblock{own, spin_, started, adapt};
  if (cfg_.yield.count() > 0) {
    const auto yield_until = Clock::now() + cfg_.yield;
    do {
      sched_yield();
      if (now_ready()) return;
      if (is_aborted()) throw_aborted(op);
    } while (Clock::now() < yield_until);
    check();
  }
  const PeerWait w(*this, chain_view(), peer, waiting_for, op, dl);
  for (;;) {
    if (is_aborted()) throw_aborted(op);
    if (w.expired()) w.timed_out("");
    sleep_on(word, w.nap(), [&](uint32_t v) {
      return !ready(v) && !own->aborted.load(std::memory_order_seq_cst);
    });
    if (now_ready()) return;
    // Woken without progress (at most every kMaxSleep): a peer that died is not waited for until
    // the deadline. An abort comes first: a rank that failed for another reason and then exited
    // has said why.
    if (is_aborted()) throw_aborted(op);
    check();
    const int32_t pid = segment(peer)->pid;
    if (peer_gone(peer)) {
      w.peer_gone("was waiting for", detail::cat("whose process (pid ", pid, ") has died"));
    }
  }
}

}  // namespace ringreduce

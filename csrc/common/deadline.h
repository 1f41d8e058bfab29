// Deadlines and the description of the op a wait belongs to.
//
// Every wait in ringreduce has a deadline, and an error raised by a wait names the op, its
// sequence number and the peer that did not come: OpContext carries the first two down to the
// transport so it can say so without knowing anything about ops.
#pragma once

#include <chrono>
#include <cstdint>

namespace ringreduce {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;

  static Deadline after(std::chrono::milliseconds d) { return Deadline{Clock::now() + d}; }
  static Deadline never() { return Deadline{Clock::time_point::max()}; }
  bool passed() const { return Clock::now() >= at; }
  // Time left, clamped at zero.
  std::chrono::nanoseconds remaining() const {
    auto now = Clock::now();
    return now >= at ? std::chrono::nanoseconds(0)
                     : std::chrono::duration_cast<std::chrono::nanoseconds>(at - now);
  }
};

struct OpContext {
  const char* name = "op";       // "allreduce", "broadcast", ...: static storage
  uint64_t seq = 0;              // the op's sequence number in its group, the same on every rank
  std::chrono::milliseconds timeout{0};  // what the deadline was made from, for messages
};

}  // namespace ringreduce

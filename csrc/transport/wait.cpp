#include "transport/wait.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#include "common/error.h"

namespace ringreduce {
namespace futex {

// No FUTEX_PRIVATE_FLAG: the words live in memory shared between processes.
void wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex needs a plain 32-bit word");
  if (timeout.count() <= 0) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // EAGAIN (value already changed), EINTR and ETIMEDOUT all mean "look again": the caller loops.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace futex

void throw_aborted(const OpContext& op, int rank, const std::string& why) {
  throw AbortedError(op_prefix(op.name, op.seq, rank) + "the group was aborted: " + why);
}

void throw_aborted(int rank, const std::string& why) {
  throw AbortedError(detail::cat("rank ", rank, ": the group was aborted: ", why));
}

void PeerWait::peer_gone(const char* verb, const std::string& why) const {
  const std::string msg = detail::cat("ringreduce ", op_.name, " #", op_.seq, ": rank ", t_.rank(),
                                      " ", verb, " rank ", peer_, " (", waiting_for_, "), ", why);
  t_.control().abort_group(msg);  // the others learn why from here, not from this rank's own departure
  throw Error(msg);
}

void PeerWait::timed_out(const char* over) const {
  const std::string msg =
      detail::cat(op_prefix(op_.name, op_.seq, t_.rank()), "Timed out after ", op_.timeout.count(),
                  " ms waiting for rank ", peer_, " (", waiting_for_, ")", over, "; ",
                  follow_waits(view_, peer_, op_));
  const std::string earlier = view_.control().abort_reason();
  if (!earlier.empty()) aborted(earlier);
  t_.control().abort_group(msg);
  throw TimeoutError(msg);
}

}  // namespace ringreduce

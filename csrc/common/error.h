// Errors thrown by the torch-free core (common, reduce, transport, ring).
//
// The core never ends the process: every failure is an exception whose message names the op, the
// rank and what was wrong. The backend layer turns these into c10::DistBackendError so that Python
// sees torch.distributed.DistBackendError (a RuntimeError).
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ringreduce {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait passed its deadline. Kept apart so callers can tell a slow or missing peer from bad input.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// The group was aborted (by this rank after an error, by a peer, or by the user); every later op
// on it fails with the reason that was recorded first.
class AbortedError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}
}  // namespace detail

}  // namespace ringreduce

// RR_CHECK(cond, "ringreduce allreduce: rank ", r, " expected ", n, ...) throws ringreduce::Error.
#define RR_CHECK(cond, ...)                                               \
  do {                                                                    \
    if (!(cond)) throw ::ringreduce::Error(::ringreduce::detail::cat(__VA_ARGS__)); \
  } while (0)

// Like RR_CHECK for a system call that set errno; appends strerror(errno).
#define RR_SYSCHECK(cond, ...)                                                     \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      const int rr_errno_ = errno;                                                 \
      throw ::ringreduce::Error(::ringreduce::detail::cat(__VA_ARGS__, ": ",       \
                                                          std::strerror(rr_errno_))); \
    }                                                                              \
  } while (0)

// Errors thrown by the torch-free core (build.cfg's CORE_DIRS: common, reduce, transport, ring,
// algo, p2p).
//
// The core never ends the process: every failure is an exception whose message names the op, the
// rank and what was wrong. The backend layer turns these into c10::DistBackendError so that Python
// sees torch.distributed.DistBackendError (a RuntimeError).
#pragma once

#include <cerrno>
#include <cstdint>
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

// The start of every message that blames an op: "ringreduce allreduce: rank 3: " for a call checked
// before it has a sequence number, "ringreduce allreduce #17: rank 3: " once it has one. Users and
// scripts grep for this shape, so it is built here and nowhere else.
inline std::string op_prefix(const char* op, int rank) {
  return detail::cat("ringreduce ", op, ": rank ", rank, ": ");
}
inline std::string op_prefix(const std::string& op, int rank) { return op_prefix(op.c_str(), rank); }
inline std::string op_prefix(const char* op, uint64_t seq, int rank) {
  return detail::cat("ringreduce ", op, " #", seq, ": rank ", rank, ": ");
}
inline std::string op_prefix(const std::string& op, uint64_t seq, int rank) {
  return op_prefix(op.c_str(), seq, rank);
}

}  // namespace ringreduce

// RR_CHECK(cond, op_prefix(op, seq, rank), "expected ", n, ...) throws ringreduce::Error.
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

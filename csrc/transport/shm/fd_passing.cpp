#include "transport/shm/fd_passing.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/error.h"

namespace ringreduce {

namespace {

// An abstract address: a leading NUL, then the name (no file is made anywhere).
socklen_t abstract_address(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof a->sun_path - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

}  // namespace

FdServer::FdServer(const std::string& name, int fd) : fd_(fd) {
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  RR_SYSCHECK(listen_fd_ >= 0, "ringreduce shm: cannot make a socket to hand out ", name);
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  if (bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), len) != 0 || listen(listen_fd_, 64) != 0) {
    const int e = errno;
    close(listen_fd_);
    errno = e;
    RR_SYSCHECK(false, "ringreduce shm: cannot listen on the abstract socket ", name);
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    const int e = errno;
    close(listen_fd_);
    errno = e;
    RR_SYSCHECK(false, "ringreduce shm: cannot make an eventfd to serve ", name);
  }
  thread_ = std::thread([this] { serve(); });
}

FdServer::~FdServer() {
  stop_.store(true);
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = write(wake_fd_, &one, sizeof one);
  thread_.join();
  close(wake_fd_);
  close(listen_fd_);
}

void FdServer::serve() {
  while (!stop_.load()) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // A peer's connect, or the destructor; the 100 ms bound is only a backstop.
    if (poll(p, 2, 100) <= 0 || (p[0].revents & POLLIN) == 0) continue;
    const int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == geteuid()) {
      char byte = 'f';
      iovec iov{&byte, 1};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msghdr m{};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = control;
      m.msg_controllen = sizeof control;
      cmsghdr* h = CMSG_FIRSTHDR(&m);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(h), &fd_, sizeof(int));
      sendmsg(c, &m, MSG_NOSIGNAL);
    }
    close(c);
  }
}

int fetch_fd(const std::string& name, std::chrono::milliseconds timeout) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  int got = -1;
  if (connect(s, reinterpret_cast<const sockaddr*>(&a), len) == 0) {
    char byte;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    if (recvmsg(s, &m, MSG_CMSG_CLOEXEC) == 1) {
      cmsghdr* h = CMSG_FIRSTHDR(&m);
      if (h != nullptr && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
          h->cmsg_len == CMSG_LEN(sizeof(int))) {
        std::memcpy(&got, CMSG_DATA(h), sizeof(int));
      }
    }
  }
  close(s);
  if (got < 0) return -1;
  // The descriptor passed is the owner's open file itself; reopened, it is one of this process's,
  // whose locks are its own (the owner's shared lock is how peers tell that it lives).
  const int own = open(("/proc/self/fd/" + std::to_string(got)).c_str(), O_RDWR | O_CLOEXEC);
  close(got);
  return own;
}

}  // namespace ringreduce

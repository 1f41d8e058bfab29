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
#include <cstring>

#include "common/error.h"

namespace ringreduce {

namespace {

using Clock = std::chrono::steady_clock;

// An abstract address: a leading NUL, then the name (no file is made anywhere).
socklen_t abstract_address(const std::string& name, sockaddr_un* a) {
  std::memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof a->sun_path - 1);
  std::memcpy(a->sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// Waits until `fd` is ready for `events` or `deadline` passes; retries after signals.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// A one-byte message with room for one descriptor (SCM_RIGHTS).
struct FdMessage {
  char byte = 'f';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

bool same_user(int conn) {
  ucred cred{};
  socklen_t cl = sizeof cred;
  return getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == geteuid();
}

}  // namespace

FdServer::FdServer(const std::string& name, int fd, uint64_t secret) : fd_(fd), secret_(secret) {
  listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  RR_SYSCHECK(listen_fd_ >= 0, "ringreduce shm: cannot make a socket to hand out ", name);
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0 || bind(listen_fd_, reinterpret_cast<const sockaddr*>(&a), len) != 0 ||
      listen(listen_fd_, 128) != 0) {
    const int e = errno;
    close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    errno = e;
    RR_SYSCHECK(false, "ringreduce shm: cannot listen on the abstract socket ", name);
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
    answer(c);
    close(c);
  }
}

void FdServer::answer(int c) {
  if (!same_user(c)) return;
  // The secret first, within a short deadline: a process that does not send it gets nothing, and
  // holds the serving thread up for at most this long.
  uint64_t got = 0;
  size_t have = 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(500);
  while (have < sizeof got) {
    if (!wait_for(c, POLLIN, deadline)) return;
    const ssize_t n = recv(c, reinterpret_cast<char*>(&got) + have, sizeof got - have, MSG_DONTWAIT);
    if (n > 0) have += static_cast<size_t>(n);
    else if (n == 0 || (errno != EINTR && errno != EAGAIN)) return;
  }
  if (got != secret_) return;
  FdMessage msg;
  cmsghdr* h = CMSG_FIRSTHDR(&msg.m);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd_, sizeof(int));
  while (sendmsg(c, &msg.m, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

int fetch_fd(const std::string& name, uint64_t secret, Clock::time_point deadline, std::string* why) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) {
    *why = detail::cat("socket: ", std::strerror(errno));
    return -1;
  }
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{s};
  sockaddr_un a;
  const socklen_t len = abstract_address(name, &a);
  int r;
  do {
    r = connect(s, reinterpret_cast<const sockaddr*>(&a), len);
  } while (r != 0 && errno == EINTR);
  if (r != 0 && errno == EAGAIN) {  // the owner's backlog is full: once more, when it has room
    if (!wait_for(s, POLLOUT, deadline)) {
      *why = "its socket did not take the connection in time";
      return -1;
    }
    r = connect(s, reinterpret_cast<const sockaddr*>(&a), len);
  }
  if (r != 0) {
    *why = detail::cat("connect: ", std::strerror(errno));
    return -1;
  }
  if (!same_user(s)) {
    *why = "its socket belongs to another user";
    return -1;
  }
  size_t sent = 0;
  while (sent < sizeof secret) {
    if (!wait_for(s, POLLOUT, deadline)) {
      *why = "its socket did not take the secret in time";
      return -1;
    }
    const ssize_t n = send(s, reinterpret_cast<const char*>(&secret) + sent, sizeof secret - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<size_t>(n);
    else if (errno != EINTR && errno != EAGAIN) {
      *why = detail::cat("send: ", std::strerror(errno));
      return -1;
    }
  }
  FdMessage msg;
  ssize_t n;
  for (;;) {
    if (!wait_for(s, POLLIN, deadline)) {
      *why = "no descriptor came in time";
      return -1;
    }
    n = recvmsg(s, &msg.m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
  }
  int got = -1;
  const cmsghdr* h = n == 1 ? CMSG_FIRSTHDR(&msg.m) : nullptr;
  if (h != nullptr && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
      h->cmsg_len == CMSG_LEN(sizeof(int))) {
    std::memcpy(&got, CMSG_DATA(h), sizeof(int));
  }
  if (got < 0) {
    *why = "it refused (the secret did not match)";
    return -1;
  }
  // The descriptor passed is the owner's open file itself; reopened, it is one of this process's,
  // whose locks are its own (the owner's shared lock is how peers tell that it lives).
  const int own = open(("/proc/self/fd/" + std::to_string(got)).c_str(), O_RDWR | O_CLOEXEC);
  const int e = errno;
  close(got);
  if (own < 0) *why = detail::cat("reopening it: ", std::strerror(e));
  return own;
}

}  // namespace ringreduce

// Both ends of a connection's set-up: the higher rank of a pair connects and says hello
// (connect_to), the lower one's I/O thread accepts and checks the hello before it answers
// (accept_all, service_pending); a connection whose hello is wrong, garbled or late is dropped
// with the reason logged.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "transport/tcp/address.h"
#include "transport/tcp/conn.h"

namespace ringreduce {

namespace {

// An accepted connection must deliver its whole tcp::Hello within this time.
constexpr std::chrono::milliseconds kHelloTimeout{5000};

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // best effort: latency only
}

// Waits for `events` on fd until the deadline; false on timeout.
bool poll_until(int fd, short events, const Deadline& dl) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(dl.remaining());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the next call report the error
  }
}

}  // namespace

void TcpTransport::connect_to(int peer, uint32_t socket_index, const std::string& where,
                              const Deadline& dl) {
  sockaddr_in addr{};
  RR_CHECK(tcp::parse_address(where, &addr), "ringreduce tcp: rank ", peer,
           " published a malformed address '", where, "'");
  int fd = -1;
  std::string last_error = "no attempt";
  while (!dl.passed()) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    RR_SYSCHECK(fd >= 0, "ringreduce tcp: rank ", rank_, " cannot create a socket");
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (rc != 0 && errno == EINPROGRESS) {
      if (poll_until(fd, POLLOUT, dl)) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) break;
    last_error = std::strerror(errno);
    close(fd);
    fd = -1;
    // Refused or unreachable for a moment (a listener's backlog full, a route coming up): retry.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  RR_CHECK(fd >= 0, "ringreduce tcp: rank ", rank_, " could not connect to rank ", peer, " at ",
           where, " within ", cfg_.connect_timeout.count(), " ms: ", last_error);
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->peer = peer;
  c->socket = socket_index;
  c->remote = where;
  try {
    set_nodelay(fd);
    tcp::Hello mine = hello_;
    mine.socket = socket_index;
    size_t done = 0;
    while (done < sizeof mine) {
      const ssize_t n = send(fd, reinterpret_cast<const uint8_t*>(&mine) + done, sizeof mine - done,
                             MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        RR_CHECK(poll_until(fd, POLLOUT, dl), "ringreduce tcp: rank ", rank_,
                 " timed out sending its hello to rank ", peer, " at ", where);
      } else {
        RR_SYSCHECK(false, "ringreduce tcp: rank ", rank_, " cannot send its hello to rank ", peer,
                    " at ", where);
      }
    }
    uint8_t buf[sizeof(tcp::Hello)];
    size_t got = 0;
    while (got < sizeof buf) {
      const ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        RR_CHECK(poll_until(fd, POLLIN, dl), "ringreduce tcp: rank ", rank_, " timed out waiting for rank ",
                 peer, " at ", where, " to answer its hello");
      } else {
        RR_CHECK(false, "ringreduce tcp: rank ", peer, " at ", where, " closed the connection of rank ",
                 rank_, " during the handshake", n < 0 ? detail::cat(": ", std::strerror(errno)) : "");
      }
    }
    tcp::Hello theirs;
    const std::string why = tcp::check_hello(buf, got, expect_, &theirs);
    RR_CHECK(why.empty() && theirs.rank == peer && theirs.socket == socket_index,
             "ringreduce tcp: rank ", rank_, ": the listener at ", where, " (rank ", peer,
             "'s address) answered with ",
             why.empty() ? detail::cat("the hello of rank ", theirs.rank, " socket ", theirs.socket) : why);
  } catch (...) {
    close(fd);
    throw;
  }
  std::lock_guard<std::mutex> lock(mu_);
  c->established = true;
  peers_[peer]->conns[socket_index] = c.get();
  c->next_msg = socket_index;
  ++established_;
  adopted_.push_back(std::move(c));
  wake_io();
}

void TcpTransport::accept_all() {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a connection that went away before we took it
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->remote = tcp::sockaddr_text(from);
    c->hello_deadline = Clock::now() + kHelloTimeout;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = c.get();
    c->interest = EPOLLIN;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    pending_.push_back(std::move(c));
  }
}

void TcpTransport::service_pending(Conn& c) {
  auto drop = [&](const std::string& why) {
    log(detail::cat("dropped a connection from ", c.remote, ": ", why));
    ++rejected_;
    close(c.fd);
    pending_.erase(std::find_if(pending_.begin(), pending_.end(),
                                [&](const std::unique_ptr<Conn>& p) { return p.get() == &c; }));
  };
  for (;;) {
    const ssize_t n = recv(c.fd, c.hello + c.hello_got, sizeof c.hello - c.hello_got, 0);
    if (n > 0) {
      c.hello_got += static_cast<size_t>(n);
      if (c.hello_got < sizeof c.hello) continue;
      break;
    }
    if (n == 0) return drop(detail::cat("it closed after ", c.hello_got, " bytes of hello"));
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    return drop(detail::cat("recv: ", std::strerror(errno)));
  }
  tcp::Hello theirs;
  std::string why = tcp::check_hello(c.hello, c.hello_got, expect_, &theirs);
  // Check the bytes that follow the hello too: a valid peer sends nothing before our answer.
  if (why.empty()) {
    uint8_t extra;
    const ssize_t more = recv(c.fd, &extra, 1, MSG_PEEK);
    if (more > 0) why = "bytes after its hello, before the answer";
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (why.empty()) {
    const int p = theirs.rank;
    if (p <= rank_ || !peers_[p]) {
      why = detail::cat("a hello from rank ", p, ", which does not connect to rank ", rank_);
    } else if (peers_[p]->conns[theirs.socket] != nullptr) {
      why = detail::cat("a second connection for rank ", p, " socket ", theirs.socket);
    }
  }
  if (!why.empty()) {
    lock.unlock();
    return drop(why);
  }
  tcp::Hello mine = hello_;
  mine.socket = theirs.socket;
  const ssize_t sent = send(c.fd, &mine, sizeof mine, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent != static_cast<ssize_t>(sizeof mine)) {
    lock.unlock();
    return drop("could not answer its hello");
  }
  set_nodelay(c.fd);
  c.peer = theirs.rank;
  c.socket = theirs.socket;
  c.next_msg = theirs.socket;
  c.established = true;
  peers_[c.peer]->conns[c.socket] = &c;
  ++established_;
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const std::unique_ptr<Conn>& p) { return p.get() == &c; });
  io_conns_.push_back(std::move(*it));
  pending_.erase(it);
  lock.unlock();
  cv_.notify_all();
}

// Accepted connections that did not say hello in time.
void TcpTransport::drop_late_hellos() {
  const auto now = Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Conn& c = **it;
    if (now >= c.hello_deadline) {
      log(detail::cat("dropped a connection from ", c.remote, ": no complete hello within ",
                      kHelloTimeout.count(), " ms (", c.hello_got, " of ", sizeof(tcp::Hello), " bytes)"));
      ++rejected_;
      close(c.fd);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace ringreduce

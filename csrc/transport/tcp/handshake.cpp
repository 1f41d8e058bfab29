// Both ends of a connection's set-up: the higher rank of a pair connects and says hello
// (connect_and_greet), the lower one's I/O thread accepts and checks the hello before it answers
// (accept_all, service_pending); a connection whose hello is wrong, garbled or late is dropped
// with the reason logged, and the job goes on.
#include "transport/tcp/handshake.h"

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
#include <random>
#include <thread>

#include "common/error.h"
#include "transport/tcp/address.h"
#include "transport/tcp/conn.h"

namespace ringreduce {
namespace tcp {

namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

bool unhex(const std::string& s, uint8_t* out, size_t n) {
  if (s.size() != 2 * n) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = val(s[2 * i]), lo = val(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
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

Handshake::Handshake(Bootstrap& bs, const std::string& prefix, int rank, int size, uint32_t sockets,
                     uint64_t slot_bytes) {
  // The job's secret: drawn by rank 0, shared through the store, which every rank already trusts.
  const std::string secret_key = prefix + "tcp/secret";
  if (rank == 0) {
    std::random_device rd;
    for (size_t i = 0; i < kSecretBytes; ++i) expect_.secret[i] = static_cast<uint8_t>(rd());
    bs.set(secret_key, hex(expect_.secret, kSecretBytes));
  } else {
    RR_CHECK(unhex(bs.get(secret_key), expect_.secret, kSecretBytes),
             "ringreduce tcp: rank ", rank, ": the store holds a malformed job secret");
  }
  expect_.world = size;
  expect_.sockets = sockets;
  expect_.group = group_id(prefix);
  expect_.slot_bytes = slot_bytes;
  hello_.rank = rank;
  hello_.world = size;
  hello_.sockets = sockets;
  hello_.group = expect_.group;
  hello_.slot_bytes = slot_bytes;
  std::memcpy(hello_.secret, expect_.secret, kSecretBytes);
}

Hello Handshake::ours(uint32_t socket) const {
  Hello h = hello_;
  h.socket = socket;
  return h;
}

std::string Handshake::check(const uint8_t* bytes, size_t n, Hello* theirs) const {
  return check_hello(bytes, n, expect_, theirs);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // best effort: latency only
}

int connect_and_greet(const Handshake& hs, int rank, int peer, uint32_t socket_index,
                      const std::string& where, const Deadline& dl, std::chrono::milliseconds timeout) {
  sockaddr_in addr{};
  RR_CHECK(parse_address(where, &addr), "ringreduce tcp: rank ", peer,
           " published a malformed address '", where, "'");
  int fd = -1;
  std::string last_error = "no attempt";
  while (!dl.passed()) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    RR_SYSCHECK(fd >= 0, "ringreduce tcp: rank ", rank, " cannot create a socket");
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
  RR_CHECK(fd >= 0, "ringreduce tcp: rank ", rank, " could not connect to rank ", peer, " at ",
           where, " within ", timeout.count(), " ms: ", last_error);
  try {
    set_nodelay(fd);
    const Hello mine = hs.ours(socket_index);
    size_t done = 0;
    while (done < sizeof mine) {
      const ssize_t n = send(fd, reinterpret_cast<const uint8_t*>(&mine) + done, sizeof mine - done,
                             MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        RR_CHECK(poll_until(fd, POLLOUT, dl), "ringreduce tcp: rank ", rank,
                 " timed out sending its hello to rank ", peer, " at ", where);
      } else {
        RR_SYSCHECK(false, "ringreduce tcp: rank ", rank, " cannot send its hello to rank ", peer,
                    " at ", where);
      }
    }
    uint8_t buf[sizeof(Hello)];
    size_t got = 0;
    while (got < sizeof buf) {
      const ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        RR_CHECK(poll_until(fd, POLLIN, dl), "ringreduce tcp: rank ", rank, " timed out waiting for rank ",
                 peer, " at ", where, " to answer its hello");
      } else {
        RR_CHECK(false, "ringreduce tcp: rank ", peer, " at ", where, " closed the connection of rank ",
                 rank, " during the handshake", n < 0 ? detail::cat(": ", std::strerror(errno)) : "");
      }
    }
    Hello theirs;
    const std::string why = hs.check(buf, got, &theirs);
    RR_CHECK(why.empty() && theirs.rank == peer && theirs.socket == socket_index,
             "ringreduce tcp: rank ", rank, ": the listener at ", where, " (rank ", peer,
             "'s address) answered with ",
             why.empty() ? detail::cat("the hello of rank ", theirs.rank, " socket ", theirs.socket) : why);
  } catch (...) {
    close(fd);
    throw;
  }
  return fd;
}

}  // namespace tcp

void TcpTransport::connect_to(int peer, uint32_t socket_index, const std::string& where,
                              const Deadline& dl) {
  const int fd = tcp::connect_and_greet(handshake_, rank_, peer, socket_index, where, dl,
                                        cfg_.connect_timeout);
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->peer = peer;
  c->socket = socket_index;
  c->remote = where;
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
    c->hello_deadline = Clock::now() + tcp::kHelloTimeout;
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
  std::string why = handshake_.check(c.hello, c.hello_got, &theirs);
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
  const tcp::Hello mine = handshake_.ours(theirs.socket);
  const ssize_t sent = send(c.fd, &mine, sizeof mine, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (sent != static_cast<ssize_t>(sizeof mine)) {
    lock.unlock();
    return drop("could not answer its hello");
  }
  tcp::set_nodelay(c.fd);
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
                      tcp::kHelloTimeout.count(), " ms (", c.hello_got, " of ", sizeof(tcp::Hello), " bytes)"));
      ++rejected_;
      close(c.fd);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace ringreduce

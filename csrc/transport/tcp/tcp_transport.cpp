#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/error.h"

namespace ringreduce {

namespace {

// Slot layout, the same on both sides: [24, 32) FrameHead, [32, 64) MsgHeader, [64, ...) payload,
// so that a whole Data frame is one contiguous write and payloads are 64-byte aligned.
constexpr size_t kFrameAt = 24;
constexpr size_t kHeaderAt = 32;
constexpr size_t kPayloadAt = 64;
// A wait re-checks aborts (its own and the rest of the group's) at least this often.
constexpr std::chrono::milliseconds kMaxSleep{100};
// An accepted connection must deliver its whole tcp::Hello within this time.
constexpr std::chrono::milliseconds kHelloTimeout{5000};
// At teardown, how long the Bye frames may take to leave.
constexpr std::chrono::milliseconds kByeTimeout{2000};
// How long a thread that aborts the group waits for its Abort frames to be on the wire: the caller
// may end its process as soon as the error reaches it, and a peer that then sees the connection
// close before the frame would report a crash instead of the reason.
constexpr std::chrono::milliseconds kAbortFlushTimeout{1000};

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string sockaddr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return detail::cat(ip, ":", ntohs(a.sin_port));
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  RR_SYSCHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
              "ringreduce tcp: cannot make a socket non-blocking");
}

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

bool parse_address(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return false;
  out->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, text.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

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

}  // namespace

std::string choose_listen_address(const std::string& ifname, const std::string& peer_host) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    RR_SYSCHECK(getifaddrs(&list) == 0, "ringreduce tcp: cannot list network interfaces");
    std::string found, have;
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof ip);
      have += detail::cat(have.empty() ? "" : ", ", i->ifa_name, " ", ip);
      if (found.empty() && ifname == i->ifa_name) found = ip;
    }
    freeifaddrs(list);
    RR_CHECK(!found.empty(), "ringreduce tcp: RINGREDUCE_SOCKET_IFNAME=", ifname,
             " names no interface with an IPv4 address here (those with one: ", have, ")");
    return found;
  }
  auto route_to = [](const std::string& host) -> std::string {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (host.empty() || getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
    std::string out;
    // Connecting a UDP socket sends nothing: it only asks the kernel which address it would use.
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          local.sin_addr.s_addr != htonl(INADDR_ANY)) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &local.sin_addr, ip, sizeof ip);
        out = ip;
      }
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return out;
  };
  std::string a = route_to(peer_host);
  if (!a.empty()) return a;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* res = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &res) == 0 && res != nullptr) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof ip);
      a = ip;
      freeaddrinfo(res);
      return a;
    }
  }
  return "127.0.0.1";
}

struct TcpTransport::Conn {
  int fd = -1;
  int peer = -1;
  uint32_t socket = 0;
  std::string remote;  // "ip:port" of the other end, for logs and errors
  bool established = false;
  std::atomic<bool> closed{false};  // written by the I/O thread, read by any
  uint32_t interest = 0;  // events registered with epoll

  // Handshake of an accepted connection (I/O thread).
  uint8_t hello[sizeof(tcp::Hello)] = {};
  size_t hello_got = 0;
  Clock::time_point hello_deadline{};

  // Sending. The queues are filled under mu_ by any thread; the rest is the I/O thread's.
  std::deque<uint64_t> outq;       // messages to write, in order
  // Control frames, written between messages: Abort, Query and State ahead of queued data (they
  // are urgent), Bye after all of it.
  struct Ctrl {
    tcp::FrameType type;
    std::string body;
  };
  std::deque<Ctrl> ctrl;
  bool writing = false;            // a frame is half written
  bool writing_ctrl = false;
  bool inline_writer = false;      // send_end is writing a frame from the caller's thread
  size_t out_off = 0;
  bool want_out = false;

  // Receiving (I/O thread).
  enum class In { Head, MsgHeader, Payload, Reason, State } in = In::Head;
  tcp::StateBody state{};
  tcp::FrameHead head{};
  MsgHeader hdr{};
  size_t in_off = 0;
  uint64_t next_msg = 0;  // the message the next Data frame on this socket carries
  // Where the payload being read lands instead of its slot (Peer::land gave it; guarded by mu_,
  // since stop_landing clears it), and whether a recv() into it is running right now.
  uint8_t* landing = nullptr;
  bool in_landing_recv = false;
  bool may_land = false;  // the I/O thread's own: `landing` was set for this payload
  std::string reason;
  bool stalled = false;   // the next message's slot is still held by the receiver
  bool said_bye = false;
};

struct TcpTransport::Peer {
  bool connected = false;
  std::vector<Conn*> conns;  // by socket index; owned by the I/O thread's list
  // Send side: slot s holds message k (k % nslots == s) from send_end until it is written out.
  std::vector<uint8_t> send_mem;
  std::vector<uint8_t> send_busy;
  uint64_t sent = 0;
  // Receive side: slot s is full from the arrival of message k until recv_end.
  std::vector<uint8_t> recv_mem;
  std::vector<uint8_t> recv_full;
  std::vector<MsgHeader> recv_hdr;
  std::vector<uint8_t*> recv_landed;  // per slot: where its message's payload landed, or null
  // The current op's destinations (land_recvs): message land_base + i lands at land(i, hdr).
  Transport::LandFn land;
  uint64_t land_base = 0;
  uint64_t received = 0;
  bool io_waiting = false;  // the I/O thread waits for recv_end to free a slot
  // Sockets on which the peer said Bye (after all its data on that socket). When every socket has,
  // the peer shut its group down cleanly and nothing more will come from it.
  uint32_t byes = 0;
  bool departed(uint32_t sockets) const { return byes == sockets; }
  // State queries sent to the peer and answers received, and the latest answer.
  uint64_t queries = 0;
  uint64_t answers = 0;
  tcp::StateBody state{};
};

TcpTransport::TcpTransport(Bootstrap& bs, const std::string& prefix, int rank, int size,
                           const TcpConfig& cfg, const std::vector<uint8_t>& peers, TcpHooks hooks)
    : rank_(rank), size_(size), cfg_(cfg), hooks_(std::move(hooks)) {
  RR_CHECK(size >= 1 && rank >= 0 && rank < size, "ringreduce tcp: invalid rank ", rank,
           " for world size ", size);
  RR_CHECK(peers.size() == static_cast<size_t>(size), "ringreduce tcp: ", peers.size(),
           " peer flags for a group of ", size);
  RR_CHECK(cfg.slot_bytes >= 64 && cfg.slot_bytes % 64 == 0 && cfg.slot_bytes <= (64u << 20),
           "ringreduce tcp: slot size must be a multiple of 64 bytes in [64, 64M], got ", cfg.slot_bytes);
  RR_CHECK(cfg.nslots >= 2 && cfg.nslots <= 1024, "ringreduce tcp: slots per link must be in [2, 1024], got ",
           cfg.nslots);
  RR_CHECK(cfg.sockets >= 1 && cfg.sockets <= 64, "ringreduce tcp: sockets per peer must be in [1, 64], got ",
           cfg.sockets);
  slot_stride_ = round_up(kPayloadAt + cfg.slot_bytes, 64);

  // The job's secret: drawn by rank 0, shared through the store, which every rank already trusts.
  const std::string secret_key = prefix + "tcp/secret";
  if (rank == 0) {
    std::random_device rd;
    for (size_t i = 0; i < tcp::kSecretBytes; ++i) expect_.secret[i] = static_cast<uint8_t>(rd());
    bs.set(secret_key, hex(expect_.secret, tcp::kSecretBytes));
  } else {
    RR_CHECK(unhex(bs.get(secret_key), expect_.secret, tcp::kSecretBytes),
             "ringreduce tcp: rank ", rank, ": the store holds a malformed job secret");
  }
  expect_.world = size;
  expect_.sockets = cfg.sockets;
  expect_.group = tcp::group_id(prefix);
  expect_.slot_bytes = cfg.slot_bytes;
  hello_.rank = rank;
  hello_.world = size;
  hello_.sockets = cfg.sockets;
  hello_.group = expect_.group;
  hello_.slot_bytes = cfg.slot_bytes;
  std::memcpy(hello_.secret, expect_.secret, tcp::kSecretBytes);

  peers_.resize(size);
  for (int p = 0; p < size; ++p) {
    if (p == rank || !peers[p]) continue;
    auto pr = std::make_unique<Peer>();
    pr->connected = true;
    pr->conns.assign(cfg.sockets, nullptr);
    // Owned here, one set per connected peer: nslots slots each way.
    pr->send_mem.assign(cfg.nslots * slot_stride_, 0);
    pr->send_busy.assign(cfg.nslots, 0);
    pr->recv_mem.assign(cfg.nslots * slot_stride_, 0);
    pr->recv_full.assign(cfg.nslots, 0);
    pr->recv_hdr.assign(cfg.nslots, MsgHeader{});
    pr->recv_landed.assign(cfg.nslots, nullptr);
    peers_[p] = std::move(pr);
    expected_conns_ += static_cast<int>(cfg.sockets);
  }

  try {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    RR_SYSCHECK(listen_fd_ >= 0, "ringreduce tcp: rank ", rank, " cannot create a socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    RR_CHECK(inet_pton(AF_INET, cfg.listen_address.c_str(), &addr.sin_addr) == 1,
             "ringreduce tcp: rank ", rank, ": '", cfg.listen_address, "' is not an IPv4 address");
    RR_SYSCHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
                "ringreduce tcp: rank ", rank, " cannot listen on ", cfg.listen_address);
    RR_SYSCHECK(listen(listen_fd_, 128) == 0, "ringreduce tcp: rank ", rank, " cannot listen");
    socklen_t len = sizeof addr;
    RR_SYSCHECK(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
                "ringreduce tcp: getsockname");
    address_ = sockaddr_text(addr);

    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    RR_SYSCHECK(epoll_fd_ >= 0, "ringreduce tcp: epoll_create1");
    event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    RR_SYSCHECK(event_fd_ >= 0, "ringreduce tcp: eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &event_fd_;
    RR_SYSCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev) == 0, "ringreduce tcp: epoll_ctl");
    ev.data.ptr = &listen_fd_;
    RR_SYSCHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) == 0, "ringreduce tcp: epoll_ctl");
    io_ = std::thread([this] { io_loop(); });

    bs.set(prefix + "tcp/addr/" + std::to_string(rank), address_);
    const Deadline dl = Deadline::after(cfg.connect_timeout);
    // The higher rank of a pair connects; the lower one's I/O thread accepts.
    for (int p = 0; p < rank; ++p) {
      if (!peers[p]) continue;
      const std::string where = bs.get(prefix + "tcp/addr/" + std::to_string(p));
      for (uint32_t s = 0; s < cfg.sockets; ++s) connect_to(p, s, where, dl);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, dl.at, [this] { return established_ == expected_conns_ || aborted_; });
    if (aborted_) throw Error(detail::cat("ringreduce tcp: rank ", rank_, ": ", reason_));
    if (established_ != expected_conns_) {
      std::string missing;
      for (int p = rank + 1; p < size; ++p) {
        if (!peers_[p]) continue;
        const auto n = std::count(peers_[p]->conns.begin(), peers_[p]->conns.end(), nullptr);
        if (n) missing += detail::cat(missing.empty() ? "" : ", ", "rank ", p, " (", n, " of ",
                                      cfg.sockets, " sockets)");
      }
      throw Error(detail::cat("ringreduce tcp: rank ", rank_, " (listening on ", address_,
                              ") timed out after ", cfg.connect_timeout.count(),
                              " ms waiting for connections from ", missing));
    }
  } catch (...) {
    close_all();
    throw;
  }
}

void TcpTransport::close_all() {
  stop_ = true;
  wake_io();
  if (io_.joinable()) io_.join();
  for (auto* list : {&io_conns_, &pending_, &adopted_}) {
    for (auto& c : *list) {
      if (c->fd >= 0) close(c->fd);
      c->fd = -1;
    }
  }
  for (int* fd : {&listen_fd_, &epoll_fd_, &event_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

TcpTransport::~TcpTransport() {
  // Say goodbye on every connection, so that peers tell this from a crash, and let it leave.
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& pr : peers_) {
      if (!pr) continue;
      for (Conn* c : pr->conns) {
        if (c != nullptr && !c->closed) c->ctrl.push_back({tcp::FrameType::Bye, {}});
      }
    }
  }
  wake_io();
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, Clock::now() + kByeTimeout, [this] {
      for (auto& pr : peers_) {
        if (!pr) continue;
        for (Conn* c : pr->conns) {
          if (c != nullptr && !c->closed && !c->ctrl.empty()) return false;
        }
      }
      return true;
    });
  }
  close_all();
}

void TcpTransport::log(const std::string& what) const {
  std::fprintf(stderr, "[ringreduce tcp] rank %d: %s\n", rank_, what.c_str());
  std::fflush(stderr);
}

void TcpTransport::wake_io() {
  if (event_fd_ < 0) return;
  const uint64_t one = 1;
  ssize_t n = write(event_fd_, &one, sizeof one);
  (void)n;  // a full counter already means "wake up"
}

void TcpTransport::notify_progress() {
  cv_.notify_all();
  if (!cfg_.doorbells) return;
  if (hooks_.ring_doorbell) {
    hooks_.ring_doorbell();
  } else {
    doorbell_.value.fetch_add(1, std::memory_order_seq_cst);
    if (doorbell_.sleepers.load(std::memory_order_seq_cst) != 0) futex::wake_all(&doorbell_.value);
  }
}

void TcpTransport::connect_to(int peer, uint32_t socket_index, const std::string& where,
                              const Deadline& dl) {
  sockaddr_in addr{};
  RR_CHECK(parse_address(where, &addr), "ringreduce tcp: rank ", peer,
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

// ---- the I/O thread ---------------------------------------------------------------------------

void TcpTransport::io_loop() {
  epoll_event events[64];
  while (!stop_.load()) {
    const int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(kMaxSleep.count()));
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &event_fd_) {
        uint64_t v;
        while (read(event_fd_, &v, sizeof v) > 0) {
        }
        woken = true;
      } else if (tag == &listen_fd_) {
        accept_all();
      } else {
        Conn* c = static_cast<Conn*>(tag);
        if (c->established) {
          service(*c);
        } else {
          service_pending(*c);
        }
      }
    }
    {
      std::vector<std::unique_ptr<Conn>> adopted;
      {
        std::lock_guard<std::mutex> lock(mu_);
        adopted.swap(adopted_);
      }
      for (auto& c : adopted) {
        set_nonblocking(c->fd);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = c.get();
        c->interest = EPOLLIN;
        if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
          conn_failed(*c, detail::cat("epoll_ctl: ", std::strerror(errno)));
        }
        io_conns_.push_back(std::move(c));
        woken = true;
      }
    }
    // New messages to send, freed receive slots and control frames come with a wake-up.
    if (woken) {
      for (auto& c : io_conns_) service(*c);
    }
    // Accepted connections that did not say hello in time.
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
    c->remote = sockaddr_text(from);
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

void TcpTransport::service(Conn& c) {
  if (c.closed) return;
  if (!flush(c)) return;
  if (!drain(c)) return;
  if (!flush(c)) return;  // answers to the queries drain() found
  update_interest(c);
}

void TcpTransport::update_interest(Conn& c) {
  if (c.closed) return;
  const uint32_t want = (c.stalled ? 0u : static_cast<uint32_t>(EPOLLIN)) |
                        (c.want_out ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &c;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) == 0) c.interest = want;
}

bool TcpTransport::flush(Conn& c) {
  Peer& pr = *peers_[c.peer];
  for (;;) {
    const uint8_t* data;
    size_t total;
    uint64_t msg = 0;
    std::string frame;  // a control frame, built from the queue's front
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (c.inline_writer) return true;  // send_end has the socket; it wakes us if it stops short
      if (!c.writing) {
        // An Abort goes out before queued data (it is urgent); a Bye only after all of it.
        if (!c.ctrl.empty() && (c.ctrl.front().type != tcp::FrameType::Bye || c.outq.empty())) {
          c.writing = true;
          c.writing_ctrl = true;
        } else if (!c.outq.empty()) {
          c.writing = true;
          c.writing_ctrl = false;
        } else {
          c.want_out = false;
          return true;
        }
        c.out_off = 0;
      }
      if (c.writing_ctrl) {
        const Conn::Ctrl& f = c.ctrl.front();
        tcp::FrameHead h;
        h.type = static_cast<uint32_t>(f.type);
        h.len = static_cast<uint32_t>(std::min(f.body.size(), tcp::kMaxReasonBytes));
        frame.assign(reinterpret_cast<const char*>(&h), sizeof h);
        frame.append(f.body, 0, h.len);
      } else {
        msg = c.outq.front();
      }
    }
    if (c.writing_ctrl) {
      data = reinterpret_cast<const uint8_t*>(frame.data());
      total = frame.size();
    } else {
      const uint8_t* slot = pr.send_mem.data() + (msg % cfg_.nslots) * slot_stride_;
      MsgHeader hdr;
      std::memcpy(&hdr, slot + kHeaderAt, sizeof hdr);
      data = slot + kFrameAt;
      total = (kPayloadAt - kFrameAt) + hdr.bytes;
    }
    while (c.out_off < total) {
      const ssize_t n = send(c.fd, data + c.out_off, total - c.out_off, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        c.want_out = true;
        return true;
      }
      conn_failed(c, detail::cat("send: ", std::strerror(errno)));
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      c.writing = false;
      if (c.writing_ctrl) {
        c.ctrl.pop_front();
      } else {
        c.outq.pop_front();
        pr.send_busy[msg % cfg_.nslots] = 0;
      }
    }
    notify_progress();
  }
}

bool TcpTransport::drain(Conn& c) {
  Peer& pr = *peers_[c.peer];
  for (;;) {
    uint8_t* into = nullptr;
    size_t want = 0;
    switch (c.in) {
      case Conn::In::Head:
        into = reinterpret_cast<uint8_t*>(&c.head);
        want = sizeof c.head;
        break;
      case Conn::In::MsgHeader: {
        if (c.in_off == 0) {
          // The message's slot must be free before a byte of it is read.
          std::lock_guard<std::mutex> lock(mu_);
          if (c.next_msg - pr.received >= cfg_.nslots) {
            c.stalled = true;
            pr.io_waiting = true;
            return true;
          }
          c.stalled = false;
        }
        into = reinterpret_cast<uint8_t*>(&c.hdr);
        want = sizeof c.hdr;
        break;
      }
      case Conn::In::Payload:
        into = pr.recv_mem.data() + (c.next_msg % cfg_.nslots) * slot_stride_ + kPayloadAt;
        if (c.may_land) {
          // Marked under the lock, so that stop_landing can wait for this recv() to return.
          std::lock_guard<std::mutex> lock(mu_);
          if (c.landing != nullptr) {
            into = c.landing;
            c.in_landing_recv = true;
          }
        }
        want = c.hdr.bytes;
        break;
      case Conn::In::Reason:
        into = reinterpret_cast<uint8_t*>(&c.reason[0]);
        want = c.reason.size();
        break;
      case Conn::In::State:
        into = reinterpret_cast<uint8_t*>(&c.state);
        want = sizeof c.state;
        break;
    }
    if (c.in_off < want) {
      const ssize_t n = recv(c.fd, into + c.in_off, want - c.in_off, 0);
      if (c.in == Conn::In::Payload && c.may_land) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          c.in_landing_recv = false;
        }
        landing_cv_.notify_all();
      }
      if (n > 0) {
        c.in_off += static_cast<size_t>(n);
      } else if (n == 0) {
        std::unique_lock<std::mutex> lock(mu_);
        const bool clean = c.said_bye && c.in == Conn::In::Head && c.in_off == 0;
        lock.unlock();
        if (clean) {
          retire(c);
          cv_.notify_all();
        } else {
          conn_failed(c, "the connection closed without a goodbye (its process exited or crashed)");
        }
        return false;
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return true;
      } else {
        conn_failed(c, detail::cat("recv: ", std::strerror(errno)));
        return false;
      }
      if (c.in_off < want) continue;
    }
    // A part is complete.
    c.in_off = 0;
    switch (c.in) {
      case Conn::In::Head: {
        const std::string why = tcp::check_frame_head(c.head, cfg_.slot_bytes);
        if (!why.empty()) {
          conn_failed(c, detail::cat("it sent ", why));
          return false;
        }
        const auto type = static_cast<tcp::FrameType>(c.head.type);
        if (type == tcp::FrameType::Data) {
          c.in = Conn::In::MsgHeader;
        } else if (type == tcp::FrameType::Abort) {
          c.reason.assign(c.head.len, '\0');
          c.in = Conn::In::Reason;
          if (c.head.len == 0) {
            c.in = Conn::In::Head;
            abort_group(detail::cat("rank ", c.peer, " aborted the group"));
          }
        } else if (type == tcp::FrameType::Query) {
          // Answered by this thread, so a rank whose own thread is stuck in an op still answers.
          const PeerState me = own_state();
          tcp::StateBody body;
          body.op_seq = me.op_seq;
          body.blocked_on = me.blocked_on;
          std::lock_guard<std::mutex> lock(mu_);
          c.ctrl.push_back({tcp::FrameType::State,
                            std::string(reinterpret_cast<const char*>(&body), sizeof body)});
        } else if (type == tcp::FrameType::State) {
          c.in = Conn::In::State;
        } else {  // Bye
          c.said_bye = true;
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++pr.byes;
          }
          cv_.notify_all();
        }
        break;
      }
      case Conn::In::MsgHeader: {
        const std::string why = tcp::check_data_header(c.hdr, c.head.len);
        if (!why.empty()) {
          conn_failed(c, detail::cat("it sent ", why));
          return false;
        }
        c.in = Conn::In::Payload;
        if (c.hdr.bytes != 0) {
          std::lock_guard<std::mutex> lock(mu_);
          if (pr.land && c.next_msg >= pr.land_base) {
            c.landing = static_cast<uint8_t*>(pr.land(c.next_msg - pr.land_base, c.hdr));
            c.may_land = c.landing != nullptr;
          }
          break;
        }
        [[fallthrough]];
      }
      case Conn::In::Payload: {
        {
          std::lock_guard<std::mutex> lock(mu_);
          const size_t s = c.next_msg % cfg_.nslots;
          pr.recv_hdr[s] = c.hdr;
          pr.recv_full[s] = 1;
          pr.recv_landed[s] = c.landing;
          if (c.landing != nullptr) landed_.fetch_add(1, std::memory_order_relaxed);
          c.landing = nullptr;
          c.may_land = false;
        }
        c.next_msg += cfg_.sockets;
        c.in = Conn::In::Head;
        notify_progress();
        break;
      }
      case Conn::In::Reason:
        c.in = Conn::In::Head;
        abort_group(c.reason);
        break;
      case Conn::In::State: {
        c.in = Conn::In::Head;
        const std::string why = tcp::check_state_body(c.state, size_);
        if (!why.empty()) {
          conn_failed(c, detail::cat("it sent ", why));
          return false;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          pr.state = c.state;
          ++pr.answers;
        }
        cv_.notify_all();
        break;
      }
    }
  }
}

// The descriptor stays open (shut down) until the transport goes: send_end may be using it from
// another thread, and a closed number could be reused by an unrelated socket meanwhile.
void TcpTransport::retire(Conn& c) {
  if (c.closed) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
  shutdown(c.fd, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(mu_);
    c.closed = true;
  }
  cv_.notify_all();  // a wait for this connection's frames to leave ends here
}

void TcpTransport::conn_failed(Conn& c, const std::string& why) {
  retire(c);
  if (c.said_bye) {  // whatever happens after a goodbye is no failure
    cv_.notify_all();
    return;
  }
  abort_group(detail::cat("rank ", rank_, " lost its connection to rank ", c.peer, " (", c.remote,
                          "): ", why));
}

// ---- the ring's side ---------------------------------------------------------------------------

void TcpTransport::check_peer(int peer, const char* what) const {
  RR_CHECK(peer >= 0 && peer < size_ && peer != rank_ && peers_[peer], "ringreduce tcp: ", what,
           " on rank ", rank_, " names peer ", peer, ", which is not connected over TCP");
}

void TcpTransport::throw_aborted(const OpContext& op, const std::string& why) const {
  throw AbortedError(detail::cat("ringreduce ", op.name, " #", op.seq, ": rank ", rank_,
                                 ": the group was aborted: ", why));
}

template <class Ready>
void TcpTransport::wait_until(std::unique_lock<std::mutex>& lock, Ready ready, int peer,
                              const char* waiting_for, const OpContext& op, const Deadline& dl) {
  op_seq_.store(op.seq + 1, std::memory_order_relaxed);
  if (hooks_.note_state) hooks_.note_state(op.seq + 1, -1);
  if (ready()) return;
  // From here on we sleep: say on whom, for a peer that follows the chain of waits.
  blocked_on_.store(peer, std::memory_order_relaxed);
  if (hooks_.note_state) hooks_.note_state(op.seq + 1, peer);
  struct Unblock {
    TcpTransport& t;
    uint64_t at;
    ~Unblock() {
      t.blocked_on_.store(-1, std::memory_order_relaxed);
      if (t.hooks_.note_state) t.hooks_.note_state(at, -1);
    }
  } unblock{*this, op.seq + 1};
  for (;;) {
    if (ready()) return;
    if (aborted_) throw_aborted(op, reason_);
    if (hooks_.external_abort) {
      const std::string elsewhere = hooks_.external_abort();
      if (!elsewhere.empty()) {
        lock.unlock();
        abort_group(elsewhere);  // pass it on to the peers over TCP
        throw_aborted(op, elsewhere);
      }
    }
    if (peers_[peer]->departed(cfg_.sockets)) {
      const std::string msg = detail::cat("ringreduce ", op.name, " #", op.seq, ": rank ", rank_,
                                          " waits for rank ", peer, " (", waiting_for,
                                          "), which has shut its process group down");
      lock.unlock();
      abort_group(msg);  // the others learn why from here, not from this rank's own goodbye
      throw Error(msg);
    }
    if (dl.passed()) {
      lock.unlock();
      const std::string msg = detail::cat(
          "ringreduce ", op.name, " #", op.seq, ": rank ", rank_, ": Timed out after ",
          op.timeout.count(), " ms waiting for rank ", peer, " (", waiting_for, ") over TCP; ",
          follow_waits(chain_view(), peer, op));
      // An abort that came in meanwhile is an earlier rank's timeout, which saw more of the chain
      // (this rank may have found that rank no longer waiting).
      const std::string earlier = chain_view().abort_reason();
      if (!earlier.empty()) throw_aborted(op, earlier);
      abort_group(msg);
      throw TimeoutError(msg);
    }
    cv_.wait_until(lock, std::min(dl.at, Clock::now() + kMaxSleep));
  }
}

void* TcpTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  check_peer(peer, "send");  // wait_until records the op in op_seq_
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  const size_t s = pr.sent % cfg_.nslots;
  wait_until(lock, [&] { return !pr.send_busy[s]; }, peer,
             "a free slot: earlier messages are not on the wire yet", op, dl);
  return pr.send_mem.data() + s * slot_stride_ + kPayloadAt;
}

void TcpTransport::send_end(int peer, const MsgHeader& hdr) {
  RR_CHECK(hdr.bytes <= cfg_.slot_bytes, "ringreduce tcp: rank ", rank_, " sends ", hdr.bytes,
           " bytes to rank ", peer, ", more than a slot holds (", cfg_.slot_bytes, ")");
  Peer& pr = *peers_[peer];
  uint8_t* slot = pr.send_mem.data() + (pr.sent % cfg_.nslots) * slot_stride_;
  tcp::FrameHead h;
  h.type = static_cast<uint32_t>(tcp::FrameType::Data);
  h.len = static_cast<uint32_t>(sizeof(MsgHeader) + hdr.bytes);
  std::memcpy(slot + kFrameAt, &h, sizeof h);
  std::memcpy(slot + kHeaderAt, &hdr, sizeof hdr);
  Conn* c;
  uint64_t k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = pr.sent++;
    pr.send_busy[k % cfg_.nslots] = 1;
    c = pr.conns[k % cfg_.sockets];
    const bool idle = c->outq.empty() && c->ctrl.empty() && !c->writing && !c->closed;
    c->outq.push_back(k);
    if (!idle) return;  // the I/O thread keeps writing while a queue is non-empty
    // Nothing ahead of it: write it from this thread, which saves a hand-off to the I/O thread
    // and back per message (two wake-ups, on a machine whose cores the ranks share). Whatever
    // the socket does not take now is left to the I/O thread.
    c->writing = true;
    c->writing_ctrl = false;
    c->inline_writer = true;
    c->out_off = 0;
  }
  const uint8_t* data = slot + kFrameAt;
  const size_t total = (kPayloadAt - kFrameAt) + hdr.bytes;
  size_t off = 0;
  int err = 0;
  bool wake = false;
  while (off < total) {
    const ssize_t n = send(c->fd, data + off, total - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) err = errno;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->inline_writer = false;
    c->out_off = off;
    if (off == total) {
      c->writing = false;
      c->outq.pop_front();
      pr.send_busy[k % cfg_.nslots] = 0;
    }
    // The rest (or the error, which the I/O thread's own send will meet and report) goes on
    // there, and so do control frames queued while this thread had the socket.
    if (off != total || err != 0 || !c->ctrl.empty()) wake = true;
  }
  if (wake) wake_io();
}

const void* TcpTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                     const Deadline& dl) {
  check_peer(peer, "receive");
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  const size_t s = pr.received % cfg_.nslots;
  wait_until(lock, [&] { return pr.recv_full[s] != 0; }, peer, "its data", op, dl);
  *hdr = pr.recv_hdr[s];
  if (pr.recv_landed[s] != nullptr) return pr.recv_landed[s];
  return pr.recv_mem.data() + s * slot_stride_ + kPayloadAt;
}

void TcpTransport::recv_end(int peer) {
  Peer& pr = *peers_[peer];
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pr.recv_full[pr.received % cfg_.nslots] = 0;
    pr.recv_landed[pr.received % cfg_.nslots] = nullptr;
    ++pr.received;
    wake = pr.io_waiting;
    pr.io_waiting = false;
  }
  if (wake) wake_io();
}

void* TcpTransport::try_send_begin(int peer) {
  check_peer(peer, "send");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw AbortedError(detail::cat("rank ", rank_, ": the group was aborted: ", reason_));
  const size_t s = pr.sent % cfg_.nslots;
  if (pr.send_busy[s]) return nullptr;
  return pr.send_mem.data() + s * slot_stride_ + kPayloadAt;
}

const void* TcpTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  check_peer(peer, "receive");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) throw AbortedError(detail::cat("rank ", rank_, ": the group was aborted: ", reason_));
  const size_t s = pr.received % cfg_.nslots;
  if (!pr.recv_full[s]) return nullptr;
  *hdr = pr.recv_hdr[s];
  if (pr.recv_landed[s] != nullptr) return pr.recv_landed[s];
  return pr.recv_mem.data() + s * slot_stride_ + kPayloadAt;
}

void TcpTransport::land_recvs(int peer, LandFn land) {
  check_peer(peer, "land_recvs");
  Peer& pr = *peers_[peer];
  std::lock_guard<std::mutex> lock(mu_);
  pr.land = std::move(land);
  pr.land_base = pr.received;
}

void TcpTransport::stop_landing(int peer) {
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  pr.land = nullptr;
  for (Conn* c : pr.conns) {
    if (c == nullptr) continue;
    // A recv() into the op's memory returns at once (the socket does not block); after it, the
    // rest of that payload goes to its slot. That only happens when the op ended early (it
    // failed), so its messages are not read any more.
    landing_cv_.wait(lock, [c] { return !c->in_landing_recv; });
    c->landing = nullptr;
  }
}

uint32_t TcpTransport::doorbell() const { return doorbell_.value.load(std::memory_order_seq_cst); }

void TcpTransport::ring_doorbell() {
  doorbell_.value.fetch_add(1, std::memory_order_seq_cst);
  if (doorbell_.sleepers.load(std::memory_order_seq_cst) != 0) futex::wake_all(&doorbell_.value);
}

void TcpTransport::wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) {
  if (doorbell_.value.load(std::memory_order_acquire) != seen) return;
  doorbell_.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (doorbell_.value.load(std::memory_order_seq_cst) == seen) {
    futex::wait(&doorbell_.value, seen, std::min<std::chrono::nanoseconds>(at_most, kMaxSleep));
  }
  doorbell_.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void TcpTransport::abort_group(const std::string& why) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_) {
      aborted_ = true;
      reason_ = why.empty() ? std::string("aborted") : why;
      first = true;
      for (auto& pr : peers_) {
        if (!pr) continue;
        for (Conn* c : pr->conns) {
          if (c != nullptr && !c->closed) c->ctrl.push_back({tcp::FrameType::Abort, reason_});
        }
      }
    }
  }
  if (!first) return;
  wake_io();
  notify_progress();
  ring_doorbell();
  if (hooks_.on_abort) hooks_.on_abort(why);
  // The I/O thread sends the frames itself once it returns to its loop; any other thread waits
  // for them (flush() notifies cv_ after each frame it writes).
  if (std::this_thread::get_id() == io_.get_id()) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, Clock::now() + kAbortFlushTimeout, [this] {
    for (auto& pr : peers_) {
      if (!pr) continue;
      for (Conn* c : pr->conns) {
        if (c == nullptr || c->closed) continue;
        for (const Conn::Ctrl& f : c->ctrl) {
          if (f.type == tcp::FrameType::Abort) return false;
        }
      }
    }
    return true;
  });
}

PeerState TcpTransport::own_state() const {
  PeerState s;
  s.known = true;
  s.op_seq = op_seq_.load(std::memory_order_relaxed);
  s.blocked_on = blocked_on_.load(std::memory_order_relaxed);
  // The I/O thread calls this too, so the other side of a mixed group comes through a hook (whose
  // transport outlives this one), not through the routing transport.
  return hooks_.own_state ? later_of(s, hooks_.own_state()) : s;
}

PeerState TcpTransport::peer_state(int peer, const Deadline& dl) {
  PeerState s;
  if (peer < 0 || peer >= size_ || peer == rank_ || !peers_[peer]) {
    s.unknown = detail::cat("rank ", peer, " is not connected to rank ", rank_, " over TCP");
    return s;
  }
  Peer& pr = *peers_[peer];
  std::unique_lock<std::mutex> lock(mu_);
  Conn* c = nullptr;
  for (Conn* x : pr.conns) {
    if (x != nullptr && !x->closed) {
      c = x;
      break;
    }
  }
  if (c == nullptr) {
    s.unknown = "its connections to this rank are closed";
    return s;
  }
  const uint64_t ticket = ++pr.queries;
  c->ctrl.push_back({tcp::FrameType::Query, {}});
  lock.unlock();
  wake_io();
  lock.lock();
  // Its I/O thread answers, whatever its ranks' own thread is doing; one that does not answer is
  // stopped or starved of CPU.
  const auto start = Clock::now();
  if (!cv_.wait_until(lock, dl.at, [&] { return pr.answers >= ticket || c->closed; }) ||
      pr.answers < ticket) {
    s.unknown = detail::cat("it did not answer a state query within ",
                            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count(),
                            " ms (its process is stopped, starved of CPU, or gone)");
    return s;
  }
  s.known = true;
  s.op_seq = pr.state.op_seq;
  s.blocked_on = pr.state.blocked_on;
  return s;
}

std::string TcpTransport::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_ ? reason_ : std::string();
}

}  // namespace ringreduce

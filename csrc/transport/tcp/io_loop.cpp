// The I/O thread: one epoll loop over every connection of the transport, with non-blocking
// reads and writes, so that it never blocks on one peer while another has work. It writes the
// queued messages and control frames, reads frames into receive slots (or straight into an op's
// memory, land_recvs) and answers state queries.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/tcp/conn.h"

namespace ringreduce {

namespace {

// The loop wakes at least this often, to drop accepted connections whose Hello is late.
constexpr std::chrono::milliseconds kIdleWake{100};

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  RR_SYSCHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
              "ringreduce tcp: cannot make a socket non-blocking");
}

}  // namespace

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
    bump(doorbell_);
  }
}

void TcpTransport::io_loop() {
  epoll_event events[64];
  while (!stop_.load()) {
    const int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(kIdleWake.count()));
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
    drop_late_hellos();
  }
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
      std::memcpy(&hdr, slot + tcp::kHeaderAt, sizeof hdr);
      data = slot + tcp::kFrameAt;
      total = (tcp::kPayloadAt - tcp::kFrameAt) + hdr.bytes;
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
        into = pr.recv_mem.data() + (c.next_msg % cfg_.nslots) * slot_stride_ + tcp::kPayloadAt;
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

}  // namespace ringreduce

// TCP transport between ranks on different hosts.
//
// The same contract as the shared-memory transport: per (sender, receiver) pair a FIFO of
// `nslots` slots that the ring writes and reads in place. Here the sender's slots are local
// buffers that an I/O thread streams to the peer, and the receiver's slots are local buffers the
// I/O thread fills from the socket; send_begin waits for a slot whose last message has been
// written out, recv_begin for the next message to have arrived whole. So the ring code is the
// one the shared-memory path runs, and a group can mix the two per hop (see routed.h).
//
// Receives land in place: while an op has told where its next payloads go (land_recvs), the I/O
// thread reads a payload whose header is the expected one straight into its destination instead
// of a slot, which saves the ring a copy of every byte it receives into its output.
//
// Each pair has `sockets` connections; message k of a pair travels on socket k % sockets, so the
// receiver knows which message every frame carries without any sequence field and large
// transfers are spread over several streams. One I/O thread per transport serves every socket
// with non-blocking I/O (epoll); it never blocks on one peer while another has work.
//
// Connections: every rank listens on one port of the address chosen by choose_listen_address()
// and publishes "ip:port" through the store; the higher rank of a pair connects to the lower.
// Each side sends a Hello (wire.h) carrying the job's secret; a connection whose Hello is wrong,
// garbled or late is closed and logged, and the job goes on (the listener stays open for the
// life of the transport, so this holds after set-up as well).
//
// Failures: a peer's socket that ends without a Bye frame (its process died) or fails aborts the
// group with a reason naming that peer; an Abort frame carries a peer's abort here; every wait
// also polls an external abort (the shared-memory side of a mixed group) at least every 100 ms.
// A wait that times out follows the chain of waits by asking peers where they stand (Query and
// State frames, answered by their I/O threads), so the error names the rank that holds the group
// up, not just the neighbour it waited for.
//
// The code, by part: address.h (which address to listen on and publish), handshake.h (the Hello
// both ways), io_loop.cpp (the I/O thread), conn.h (the state per peer and per connection that
// those share), tcp_transport.cpp (set-up, teardown and the Transport calls).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/handshake.h"
#include "transport/tcp/wire.h"
#include "transport/transport.h"
#include "transport/wait.h"

namespace ringreduce {

struct TcpConfig {
  size_t slot_bytes = 256 << 10;
  uint32_t nslots = 4;
  uint32_t sockets = 2;  // connections per pair
  std::string listen_address = "127.0.0.1";  // IPv4 address to listen on
  std::chrono::milliseconds connect_timeout{60000};
  bool doorbells = false;
};

// Hooks that tie a TCP transport into a group that also has other transports.
struct TcpHooks {
  // The group was aborted on this side (an Abort frame or a dead peer): pass it on.
  std::function<void(const std::string&)> on_abort;
  // Polled by every wait: a non-empty reason aborts the wait (the group was aborted elsewhere).
  std::function<std::string()> external_abort;
  // Rung for every message that arrives and every send slot freed, where doorbells are on,
  // instead of this transport's own doorbell.
  std::function<void()> ring_doorbell;
  // This rank's state on the other side, merged into the State frames this transport sends.
  std::function<PeerState()> own_state;
  // Told where this rank stands whenever a wait here enters an op or starts or stops sleeping,
  // so that peers on the other side (which read it from shared memory) see it too.
  std::function<void(uint64_t op_seq, int32_t blocked_on)> note_state;

  // The hooks of a TCP transport made beside the group's control (transport/registry.h): its
  // aborts, doorbell rings and this rank's state go there too. None where control is null.
  static TcpHooks beside(GroupControl* control);
};

class TcpTransport final : public Transport, public GroupControl {
 public:
  // Collective over the group: connects to every peer p with peers[p] != 0 (both sides must
  // agree), and throws naming the peers that did not connect within cfg.connect_timeout.
  TcpTransport(Bootstrap& bootstrap, const std::string& prefix, int rank, int size,
               const TcpConfig& cfg, const std::vector<uint8_t>& peers, TcpHooks hooks = {});
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Its own control, told to report to the group's where it was made beside one (TcpHooks).
  GroupControl& control() const override { return const_cast<TcpTransport&>(*this); }
  size_t max_payload() const override { return cfg_.slot_bytes; }

  void* send_begin(int peer, const OpContext& op, const Deadline& dl) override;
  void send_end(int peer, const MsgHeader& hdr) override;
  const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op, const Deadline& dl) override;
  void recv_end(int peer) override;
  void* try_send_begin(int peer) override;
  const void* try_recv_begin(int peer, MsgHeader* hdr) override;
  uint32_t doorbell() const override;
  void ring_doorbell() override;
  void wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) override;

  void abort_group(const std::string& why) override;
  std::string abort_reason() const override;
  PeerState own_state() const override;
  // Kept here (and answered to peers' state queries); the other side of a mixed group keeps its
  // own (RoutedTransport::note_state).
  void note_state(uint64_t op_seq, int32_t blocked_on) override;
  // Sends the peer a Query frame and waits until `dl` for its State.
  PeerState peer_state(int peer, const Deadline& dl) override;
  // Payloads the ring would copy out of a slot are read straight into their destination.
  void land_recvs(int peer, LandFn land) override;
  void stop_landing(int peer) override;

  // "ip:port" this rank listens on.
  const std::string& address() const { return address_; }
  // Connections dropped for a bad or missing Hello since start-up (for the tests).
  uint64_t rejected_connections() const { return rejected_.load(); }
  // Messages whose payload landed in place (land_recvs) since start-up (for the tests).
  uint64_t landed_messages() const { return landed_.load(); }

 private:
  struct Conn;
  struct Peer;

  // handshake.cpp: connections made (connect_to, on this thread) and accepted (I/O thread).
  void connect_to(int peer, uint32_t socket, const std::string& addr, const Deadline& dl);
  void accept_all();
  void service_pending(Conn& c);
  void drop_late_hellos();
  // io_loop.cpp: the I/O thread.
  void io_loop();
  void service(Conn& c);
  bool flush(Conn& c);   // false: the connection failed
  bool drain(Conn& c);   // false: the connection failed or ended
  void conn_failed(Conn& c, const std::string& why);
  void retire(Conn& c);
  void update_interest(Conn& c);
  void wake_io();
  void notify_progress();
  // tcp_transport.cpp
  void log(const std::string& what) const;
  void close_all();
  void check_peer(int peer, const char* what) const;
  // Waits on cv_ (lock held) until ready(), ending as every wait does (PeerWait, wait.h).
  template <class Ready>
  void wait_until(std::unique_lock<std::mutex>& lock, Ready ready, int peer, const char* waiting_for,
                  const OpContext& op, const Deadline& dl);

  int rank_;
  int size_;
  TcpConfig cfg_;
  TcpHooks hooks_;
  tcp::Handshake handshake_;
  std::string address_;
  size_t slot_stride_ = 0;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int event_fd_ = -1;
  std::thread io_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;          // guards the fields below and the Peer/Conn queues
  std::condition_variable cv_;     // progress: a slot freed, a message arrived, an abort
  std::condition_variable landing_cv_;  // a recv() into a landing address returned
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Conn>> adopted_;  // connected by this thread, for the I/O thread
  // The I/O thread's own: accepted connections whose Hello is not complete, and every
  // established connection (closed ones stay until the end: peers_ points at them).
  std::vector<std::unique_ptr<Conn>> pending_;
  std::vector<std::unique_ptr<Conn>> io_conns_;
  int expected_conns_ = 0;
  int established_ = 0;
  bool aborted_ = false;
  std::string reason_;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> landed_{0};
  // This rank's state as a State frame gives it: set by the ring's thread in its waits.
  std::atomic<uint64_t> op_seq_{0};
  std::atomic<int32_t> blocked_on_{-1};
  WaitWord doorbell_;
};

}  // namespace ringreduce

// The state one TCP transport keeps per peer and per connection, shared by the I/O thread
// (io_loop.cpp), the handshake (handshake.cpp) and the ring's side (tcp_transport.cpp). Internal
// to transport/tcp/.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/wire.h"

namespace ringreduce {
namespace tcp {

// Slot layout, the same on both sides: [24, 32) FrameHead, [32, 64) MsgHeader, [64, ...) payload,
// so that a whole Data frame is one contiguous write and payloads are 64-byte aligned.
constexpr size_t kFrameAt = 24;
constexpr size_t kHeaderAt = 32;
constexpr size_t kPayloadAt = 64;

}  // namespace tcp

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

}  // namespace ringreduce

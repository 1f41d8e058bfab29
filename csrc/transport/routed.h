// A group whose ranks span hosts: each peer is reached through shared memory when the probe found
// it on this host, and over TCP otherwise. The ring sees one Transport; which one carries a hop
// is decided here, per peer, once.
//
// Aborts cross over: an error raised by either side aborts the other too (so a rank that times out
// on a shared-memory hop also stops its TCP peers, and a peer lost over TCP stops the local ones),
// and the TCP side polls the shared-memory side's abort flag in its waits.
//
// Timeouts: both sides follow chains of waits through this transport, so a chain that crosses
// hosts is followed over both.
#pragma once

#include <memory>
#include <vector>

#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace ringreduce {

class RoutedTransport final : public Transport {
 public:
  // Either may be null; a peer goes over TCP where over_tcp[peer] is set.
  RoutedTransport(int rank, int size, ShmTransport* shm, TcpTransport* tcp,
                  std::vector<uint8_t> over_tcp);

  // The hooks a TCP transport built for a group with `shm` needs to work beside it.
  static TcpHooks hooks_beside(ShmTransport* shm);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_payload() const override;

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
  // This rank's state is split between the two: the later op wins, with whom it waits for there.
  PeerState own_state() const override;
  void note_state(uint64_t op_seq, int32_t blocked_on) override;
  PeerState peer_state(int peer, const Deadline& dl) override;
  std::string peer_lost(int peer) const override;
  void land_recvs(int peer, LandFn land) override;
  void stop_landing(int peer) override;

 private:
  Transport& to(int peer) const;
  void cross_abort();  // after an error from either side: abort the other with the same reason

  int rank_;
  int size_;
  ShmTransport* shm_;
  TcpTransport* tcp_;
  std::vector<uint8_t> over_tcp_;
};

}  // namespace ringreduce

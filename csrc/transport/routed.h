// A group whose peers are reached by more than one transport (transport/registry.h): each peer by
// the row the link probe chose for it, decided once. The ring sees one Transport.
//
// Aborts cross over: an error raised by any row aborts the others too (so a rank that times out
// on a shared-memory hop also stops its TCP peers, and a peer lost over TCP stops the local ones).
// The first row is the group's control: the other rows report to it (their aborts, doorbell rings
// and this rank's state), so its doorbell and abort flag cover the whole group.
//
// Timeouts: every row follows chains of waits through this transport, so a chain that crosses
// hosts is followed over all of them.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/transport.h"

namespace ringreduce {

class RoutedTransport final : public Transport, public GroupControl {
 public:
  // rows[0] is the control and is never null; rows[route[p]] carries peer p (route[rank] is -1).
  RoutedTransport(int rank, int size, std::vector<Transport*> rows, std::vector<int8_t> route);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_payload() const override;
  // The group's control, over every row: aborts cross over, the doorbell and state are the
  // control row's (merged with the others' where a rank's state is split between them).
  GroupControl& control() const override { return const_cast<RoutedTransport&>(*this); }

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
  // This rank's state is split between the rows: the later op wins, with whom it waits for there.
  PeerState own_state() const override;
  void note_state(uint64_t op_seq, int32_t blocked_on) override;
  PeerState peer_state(int peer, const Deadline& dl) override;
  std::string peer_lost(int peer) const override;
  void land_recvs(int peer, LandFn land) override;
  void stop_landing(int peer) override;

 private:
  Transport& to(int peer) const;
  void cross_abort();  // after an error from any row: abort the others with the same reason

  int rank_;
  int size_;
  std::vector<Transport*> rows_;  // those that carry a peer, the control first
  std::vector<int8_t> route_;     // index into rows_ per peer
};

}  // namespace ringreduce

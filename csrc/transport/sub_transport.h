// Some ranks of a group, seen as a group of their own: what lets an algorithm run a ring over the
// ranks of one host, or over one rank per host (algo/hierarchical.h), on the group's transport.
//
// Member i of the view is rank members[i] of the group. Every call is passed on with the peer
// mapped, so the underlying transport's FIFOs, slots, deadlines, aborts and diagnoses serve the
// view unchanged: the view owns nothing and a message it sends is one of the group's messages,
// ordered with the others on the same link. Errors the ring raises name group ranks through
// group_rank().
#pragma once

#include <vector>

#include "transport/transport.h"

namespace ringreduce {

class SubTransport final : public Transport {
 public:
  // `members`: distinct group ranks in the view's order, this rank among them. `t` outlives this.
  SubTransport(Transport& t, std::vector<int> members);
  SubTransport(const SubTransport&) = delete;  // its control refers back to it
  SubTransport& operator=(const SubTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  int group_rank(int member) const override;
  size_t max_payload() const override { return t_.max_payload(); }

  void* send_begin(int peer, const OpContext& op, const Deadline& dl) override {
    return t_.send_begin(at(peer), op, dl);
  }
  void send_end(int peer, const MsgHeader& hdr) override { t_.send_end(at(peer), hdr); }
  const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op, const Deadline& dl) override {
    return t_.recv_begin(at(peer), hdr, op, dl);
  }
  void recv_end(int peer) override { t_.recv_end(at(peer)); }
  void* try_send_begin(int peer) override { return t_.try_send_begin(at(peer)); }
  const void* try_recv_begin(int peer, MsgHeader* hdr) override {
    return t_.try_recv_begin(at(peer), hdr);
  }
  GroupControl& control() const override { return ctl_; }
  void land_recvs(int peer, LandFn land) override { t_.land_recvs(at(peer), std::move(land)); }
  void stop_landing(int peer) override { t_.stop_landing(at(peer)); }

 private:
  int at(int peer) const;

  // The group's control, with the view's peers mapped to the group's ranks.
  class Control final : public GroupControl {
   public:
    explicit Control(const SubTransport& v) : v_(v) {}
    uint32_t doorbell() const override { return g().doorbell(); }
    void ring_doorbell() override { g().ring_doorbell(); }
    void wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) override {
      g().wait_doorbell(seen, at_most);
    }
    void abort_group(const std::string& why) override { g().abort_group(why); }
    std::string abort_reason() const override { return g().abort_reason(); }
    PeerState own_state() const override { return g().own_state(); }
    PeerState peer_state(int peer, const Deadline& dl) override { return g().peer_state(v_.at(peer), dl); }
    std::string peer_lost(int peer) const override { return g().peer_lost(v_.at(peer)); }

   private:
    GroupControl& g() const { return v_.t_.control(); }
    const SubTransport& v_;
  };

  Transport& t_;
  std::vector<int> members_;
  int rank_ = -1;
  mutable Control ctl_{*this};
};

}  // namespace ringreduce

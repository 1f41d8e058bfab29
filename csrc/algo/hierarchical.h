// The all-reduce of a group that spans hosts with as many ranks on each: a reduce-scatter inside
// each host (shared memory), an all-reduce of each rank's chunk with the ranks that hold the same
// chunk on the other hosts (one ring per local rank, all at once, each carrying 1/per_host of the
// message over the network), and an all-gather inside each host.
//
// A flat ring over such a group carries 2(n-1)/n of the message over each host's link and pays
// the network's latency at each of its 2(n-1) steps; this carries 2(h-1)/h of it (h hosts) in
// 2(h-1) network steps. Each phase is the ring's own code (ring.h) on a view of some of the
// group's ranks (transport/sub_transport.h), so deadlines, aborts, dead peers and the checks of
// every message work as in the flat ring; every message carries the fingerprint of the whole
// all-reduce, so ranks that disagree about the op fail naming it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "algo/messages.h"
#include "algo/ring.h"
#include "transport/hosts.h"
#include "transport/sub_transport.h"

namespace ringreduce {

class Hierarchical {
 public:
  // `hosts` must allow it (Selector::hierarchical). `t` outlives this.
  Hierarchical(Transport& t, const HostLayout& hosts, size_t slice_bytes, bool check_fingerprints);

  // As Ring::allreduce (ring.h): every rank ends with the same bits (each chunk is reduced in one
  // fixed order, inside its host and then across hosts, and copied from there).
  void allreduce(const void* in, void* out, size_t count, DType t, RedOp op, int64_t divisor,
                 const MsgHeader& fp, const OpContext& ctx, const Deadline& dl);
  // How the phases inside the host write the slots a peer core reads (Messages::slot_writes). They
  // are not timed: in the measured mode they follow what they have learnt, which is nothing, so
  // they write plainly unless streaming is asked for.
  SlotWrites& host_slot_writes() { return host_msgs_.slot_writes(); }

 private:
  SubTransport host_t_;   // this rank's host, in rank order
  SubTransport cross_t_;  // the ranks with this rank's place on every host, in host order
  Messages host_msgs_;
  Messages cross_msgs_;
  Ring host_;
  Ring cross_;
};

}  // namespace ringreduce

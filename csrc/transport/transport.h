// The one interface every transport implements (shm/, tcp/, cuda_ipc/) for the data path, the
// group's control beside it (GroupControl), and the views over them that the algorithms also run
// on (routed.h: a group over several transports; sub_transport.h: some of a group's ranks).
//
// A transport moves messages between ranks of one group. Each (sender, receiver) pair has its own
// FIFO of a few fixed-size slots: the sender writes a slot in place and publishes it; the receiver
// reads the slot in place and hands it back. Working on slots in place lets the ring fuse "receive,
// reduce with my input, send on" into one pass over the data with no staging copy.
//
// Every message starts with a MsgHeader naming the op it belongs to. Receivers check it before
// touching the payload, so ranks that disagree about an op (size, dtype, op, root, or which op it
// is at all) fail with an error instead of reducing garbage.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/deadline.h"

namespace ringreduce {

// What kind of collective a message belongs to. Part of the fingerprint in MsgHeader.
enum class OpKind : uint32_t {
  Allreduce = 1,
  Broadcast = 2,
  Barrier = 3,
  ReduceScatter = 4,
  AllGather = 5,
  Reduce = 6,
  Gather = 7,
  Scatter = 8,
  AllToAll = 9,
  // Point-to-point: a rendezvous of control messages, then the data (see p2p/p2p.h).
  P2pReady = 16,    // sender -> receiver: a send of `count` bytes with a tag waits for a recv
  P2pClear = 17,    // receiver -> sender: a recv of `count` bytes matched send `seq`: stream it
  P2pData = 18,     // sender -> receiver: payload of send `seq` at byte offset `count`
  P2pRefuse = 19,   // receiver -> sender: send `seq` will never be matched (receiver shut down)
  P2pCancel = 20,   // sender -> receiver: send `seq` was given up (it timed out) before its clear
};
const char* op_kind_name(OpKind k);

struct MsgHeader {
  uint64_t seq = 0;     // op sequence number in the group
  uint64_t count = 0;   // element count of the op (per rank)
  uint64_t bytes = 0;   // payload bytes of this message
  uint16_t kind = 0;    // OpKind
  uint8_t algo = 0;     // Algo (common/algos.h) that carries the op; 0 (Auto): point-to-point
  uint8_t spare = 0;    // 0
  uint8_t dtype = 0;    // DType
  uint8_t redop = 0;    // RedOp (0 where the op has none)
  int16_t root = -1;    // root rank, -1 where the op has none
};
static_assert(sizeof(MsgHeader) == 32, "MsgHeader is in the shared-memory layout and the TCP wire");

// "allreduce #3 of 1000 float32 (sum)": an op as a header names it, for the errors of ranks that
// disagree.
std::string describe_op(const MsgHeader& h);
// Whether two headers name the same op: every field but the message's own size.
bool same_op(const MsgHeader& a, const MsgHeader& b);

// Where a rank stands, as a peer that timed out waiting for it sees it: which op it last entered
// and whom it sleeps waiting for. Read from its segment over shared memory, asked for over TCP.
struct PeerState {
  bool known = false;       // false: it could not be learned, and `unknown` says why
  uint64_t op_seq = 0;      // 1 + the sequence number of the latest op it entered; 0: none yet
  int32_t blocked_on = -1;  // the rank it is waiting for, -1 when it is not waiting
  bool stopped = false;     // its process is stopped (SIGSTOP, a debugger), as far as one can see
  std::string unknown;
};

// Memory that every rank of the group maps, read directly by the peers: what the one-shot and
// two-shot algorithms (algo/) run on instead of messages. Each op gets a region of its owner's
// window that does not overlap the region of the op before, so a rank may start op k+1 while a
// slow peer still reads its region of op k; it cannot reach op k+2 before every peer has published
// op k+1, which each does only once it has finished reading op k. That is why every window op
// waits for every peer (wait_all), even where the data flows one way: no other handshake is needed.
class PeerWindow {
 public:
  virtual ~PeerWindow() = default;
  // Bytes of one buffer: the largest message a window op may carry per rank.
  virtual size_t capacity() const = 0;
  // Starts this rank's next window op and returns its own buffer for it, `bytes` long (at most
  // capacity()). `fp` is the op's fingerprint, which every reader compares with its own.
  virtual uint8_t* begin(const MsgHeader& fp, const OpContext& op, size_t bytes) = 0;
  // Rank `rank`'s buffer of the current op (this rank's own included). Only what that rank has
  // published and this rank has waited for may be read.
  virtual const uint8_t* buffer(int rank) const = 0;
  // Makes what this rank wrote into its buffer so far visible, as the op's next phase.
  virtual void publish() = 0;
  // Returns once every peer has published as many phases of the current op as this rank has.
  // A peer in another op (by its fingerprint, or because it sends or waits for messages) aborts
  // the group with an error that says how the two differ; deadlines, aborts and dead peers are
  // handled as in every wait.
  virtual void wait_all(const OpContext& op, const Deadline& dl) = 0;
};

// The group's control, apart from the data path: the doorbell an engine sleeps on, the group's
// abort, and where each rank stands (for the diagnosis of timeouts). A transport that carries
// messages hands out the control of its group (Transport::control()): its own where it is the
// group's only transport, the control row's in a group routed over several (routed.h), the
// host transport's for a device transport. Safe to call from any thread.
class GroupControl {
 public:
  virtual ~GroupControl() = default;

  // A counter that changes whenever a message reaches this rank or a peer frees a slot this rank
  // sent into (on transports built with doorbells on), or when ring_doorbell() is called. An
  // engine reads it, looks for work, and if it found none sleeps in wait_doorbell until it moves.
  virtual uint32_t doorbell() const = 0;
  virtual void ring_doorbell() = 0;
  virtual void wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) = 0;

  // Make every current and future wait of every rank in the group fail with an AbortedError that
  // carries `why`. The first reason recorded wins. Safe to call from any thread.
  virtual void abort_group(const std::string& why) = 0;
  // The reason the first abort_group recorded, or "" while the group is healthy.
  virtual std::string abort_reason() const = 0;

  // This rank's own state, and a peer's as far as this transport can learn it before `dl` (a
  // query over TCP, a read of its segment over shared memory). For the diagnosis of timeouts.
  virtual PeerState own_state() const = 0;
  virtual PeerState peer_state(int peer, const Deadline& dl) = 0;
  // Records where this rank stands, for peers that follow chains of waits, where the transport's
  // own waits do not say it: an engine that waits on several peers at once (point-to-point)
  // names the one it waits for. A transport that keeps no such state ignores it.
  virtual void note_state(uint64_t op_seq, int32_t blocked_on) {
    (void)op_seq;
    (void)blocked_on;
  }
  // Why `peer` is known to be gone ("its process (pid 123) has died"), or "" while it may be
  // alive. For an engine that waits on several peers at once (point-to-point) and so cannot
  // leave the question to one wait; a transport that cannot tell answers "".
  virtual std::string peer_lost(int peer) const {
    (void)peer;
    return "";
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  // The group's shared window, when every peer maps this rank's memory (one host, shared memory):
  // null otherwise, and then only messages are available.
  virtual PeerWindow* window() { return nullptr; }

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The rank of the whole group that `rank` of this transport is, for messages: itself, except in
  // a view of some of the group's ranks (transport/sub_transport.h).
  virtual int group_rank(int rank) const { return rank; }
  // Largest payload one message can carry (the slot size).
  virtual size_t max_payload() const = 0;

  // The blocking calls below wait at most until their deadline, and end as every wait does when
  // the group is aborted, the peer is gone or the deadline passes (PeerWait, wait.h).

  // Wait until a slot towards `peer` is free and return where to write at most max_payload()
  // bytes. Exactly one send may be open per peer; close it with send_end.
  virtual void* send_begin(int peer, const OpContext& op, const Deadline& dl) = 0;
  // Publish the slot opened by send_begin; hdr.bytes says how much of it is payload.
  virtual void send_end(int peer, const MsgHeader& hdr) = 0;

  // Wait for the next message from `peer`, copy its header to *hdr and return its payload, which
  // stays valid until recv_end(peer).
  virtual const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                 const Deadline& dl) = 0;
  virtual void recv_end(int peer) = 0;

  // Non-blocking forms, for an engine that serves every peer from one thread (point-to-point):
  // null when no slot is free or no message waits. They throw AbortedError once the group is
  // aborted. Close them with send_end / recv_end as above.
  virtual void* try_send_begin(int peer) = 0;
  virtual const void* try_recv_begin(int peer, MsgHeader* hdr) = 0;

  // The control of the group this transport carries messages for (doorbell, abort, where each rank
  // stands; see GroupControl): in a group over several transports, the routed group's answers for
  // all of them, and the later rows report to it.
  virtual GroupControl& control() const = 0;

  // Receives that land where the caller would copy them (optional: a transport that reads
  // payloads off a socket uses it to skip that copy; one in shared memory has nothing to skip).
  // Installed for the span of one op, before its first receive from `peer`, when every message
  // of earlier ops from `peer` has been received: message i of the op (0 = the next one to be
  // received) may be read straight into land(i, its header) when that returns non-null, and
  // recv_begin then returns that address, so the caller sees its data already in place. land
  // runs on the transport's own thread once a message's header is in and before any byte of its
  // payload; it must return null unless the header is exactly the expected one, so that nothing
  // reaches a caller's tensor that the caller's check would refuse. stop_landing(peer) removes
  // it, and returns only once no payload is being written to an address it gave.
  using LandFn = std::function<void*(uint64_t index, const MsgHeader& hdr)>;
  virtual void land_recvs(int peer, LandFn land) {
    (void)peer;
    (void)land;
  }
  virtual void stop_landing(int peer) { (void)peer; }

  // In a group that routes peers over several transports, each of them follows chains of waits
  // through the routing one, which sees every peer; by default a transport does so through
  // itself. Used only by the timeouts of ops' waits, to name the rank that holds the group up.
  void follow_chains_through(Transport* t) { chain_view_ = t; }

 protected:
  Transport& chain_view() const { return *chain_view_; }

 private:
  Transport* chain_view_ = this;
};

// Of two partial views of one rank's state (one per transport of a mixed group), the one in the
// later op, and of two in the same op the one that is waiting.
PeerState later_of(const PeerState& a, const PeerState& b);

// Who holds a group up, for a timeout of this rank waiting for `peer` in `op`: a sentence. A rank
// waits for its neighbour, which may itself wait for its own; the chain is followed through
// view.peer_state (at most one hop per rank, within kChainBudget in all) to the rank that is not
// where the others are.
constexpr std::chrono::milliseconds kChainBudget{2000};
std::string follow_waits(Transport& view, int peer, const OpContext& op);

// The bootstrap: a key-value store every rank of the group can reach (the c10d store in the torch
// layer, an in-process map in the C++ tests). get() waits for the key up to the store's timeout.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer at `key` (0 if absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

// A prefix that is new each time a group is set up on the same store: torch reuses group names
// after destroy_process_group and across a job's restarts on one store, so keys left by an earlier
// incarnation (a dead one included) must not be read. Every rank of the group calls this once, at
// the start of set-up; rank 0 gives up on a rank that has not joined after `timeout`.
std::string incarnation_prefix(Bootstrap& bs, int rank, int size, std::chrono::milliseconds timeout);

}  // namespace ringreduce

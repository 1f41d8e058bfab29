// Shared-memory transport between ranks on one host.
//
// Each rank owns one POSIX shared-memory segment holding its *inbox*: one FIFO of `nslots` slots
// per possible sender. A sender writes a slot of the receiver's segment in place and bumps the
// FIFO's head; the receiver reads the slot in place and bumps its tail. The whole segment is
// reserved at set-up (posix_fallocate), so that a /dev/shm without room for it fails there, with a
// message saying what it needs, instead of killing the process with SIGBUS in the middle of an op.
//
// Life of a segment: created 0600 under a name holding a random token that rank 0 draws and shares
// through the store, opened by every peer (which is also the probe that tells whether the peer is
// on this host), and unlinked by its owner as soon as every peer has mapped it. From then on only
// the mappings keep it alive, so a crash at any later point leaves nothing in /dev/shm.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.h"
#include "transport/wait.h"

namespace ringreduce {

class FdServer;

struct ShmConfig {
  size_t slot_bytes = 256 << 10;          // payload bytes of one slot (= largest slice)
  uint32_t nslots = 4;                    // slots per FIFO (>= 2): how far a sender may run ahead
  std::chrono::microseconds spin{20};     // spin this long before sleeping on a futex
  // The most that spin may grow to (AdaptiveSpin); at most `spin`: it stays fixed.
  std::chrono::microseconds spin_max{0};
  // Then yield the CPU this long before sleeping. With more ranks than cores the rank waited for
  // is often runnable but has no core: a yield hands it one at once, where a futex sleep would
  // cost a wake-up (tens of microseconds in a VM) on every hand-off. 0: go straight to sleep.
  std::chrono::microseconds yield{0};
  // Ring the peer's doorbell on every send_end / recv_end. Costs one more atomic per message, so
  // only the point-to-point transport, whose engine waits on all peers at once, turns it on.
  bool doorbells = false;
  // Non-zero: payloads live elsewhere (device memory, transport/cuda_ipc/) and this transport
  // carries only their headers and the FIFO control; a header may then announce up to this many
  // bytes, and slot_bytes can be the minimum.
  size_t external_payload_bytes = 0;
  // The largest window op (PeerWindow), per rank; 0: no window. Offered only when every peer is
  // reachable through shared memory.
  size_t window_bytes = 0;
  // Bytes of each of the two halves of a rank's window area, in its segment after the FIFOs (at
  // least window_bytes); 0: twice the core's private cache (common/machine.h), or four times
  // window_bytes where that is less.
  // Successive ops take successive regions of a half, so a region is written again only after
  // the peers' reads of it have left their private caches: a store to a line that another core
  // still holds waits for that core to give it up, which made the copy into a window that peers
  // had just read 2-4x slower than into one they had not (docs/algorithms.md, the shared window).
  size_t window_span = 0;
  // Segments without a name (memfd) where every rank of the machine is in one network namespace;
  // false: always named segments in /dev/shm (see the constructor).
  bool anonymous = true;
};

class ShmTransport final : public Transport, public GroupControl, private PeerWindow {
 public:
  // Collective over the group: every rank constructs its transport at the same time. `prefix`
  // scopes the store keys to this incarnation of the group (incarnation_prefix()).
  // With Reach::Require, every peer p with want[p] (every peer when `want` is empty) must be
  // reachable: a segment that cannot be opened or does not match throws ringreduce::Error naming
  // the peer. With Reach::Probe every peer is tried, and a pair whose ranks can both open the
  // other's segment is local (is_local()); the others are left to another transport.
  enum class Reach { Require, Probe };
  ShmTransport(Bootstrap& bootstrap, const std::string& prefix, int rank, int size,
               const ShmConfig& cfg, Reach reach = Reach::Require,
               const std::vector<uint8_t>& want = {});
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_payload() const override {
    return cfg_.external_payload_bytes ? cfg_.external_payload_bytes : cfg_.slot_bytes;
  }
  // Its own control: the abort flag, doorbell and state live in the segments.
  GroupControl& control() const override { return const_cast<ShmTransport&>(*this); }

  void* send_begin(int peer, const OpContext& op, const Deadline& dl) override;
  void send_end(int peer, const MsgHeader& hdr) override;
  const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op, const Deadline& dl) override;
  void recv_end(int peer) override;
  void* try_send_begin(int peer) override;
  const void* try_recv_begin(int peer, MsgHeader* hdr) override;
  uint32_t doorbell() const override;
  void ring_doorbell() override;
  void wait_doorbell(uint32_t seen, std::chrono::nanoseconds at_most) override;

  PeerWindow* window() override;

  void abort_group(const std::string& why) override;
  std::string abort_reason() const override;
  PeerState own_state() const override;
  PeerState peer_state(int peer, const Deadline& dl) override;
  std::string peer_lost(int peer) const override;
  // Records where this rank stands in its segment, for a wait on another transport of a mixed
  // group: local peers that follow a chain of waits read it there.
  void note_state(uint64_t op_seq, int32_t blocked_on) override;

  // Messages published to `peer` / released from it so far: the index of the slot the open send
  // or receive uses is this modulo nslots (for a transport that keeps payloads elsewhere).
  uint64_t sent(int peer) const { return sent_[peer]; }
  uint64_t received(int peer) const { return received_[peer]; }
  uint32_t nslots() const { return cfg_.nslots; }
  // Spins this rank cut short because the peer it waited for had last run on this rank's own
  // CPU (wait_until): for tests and diagnosis.
  uint64_t yields_to_peer() const { return yields_to_peer_; }

  // Pages of `peer`'s window that this process has no mapping for yet (none once set-up has
  // populated them): for tests and diagnosis.
  size_t unmapped_window_pages(int peer) const;

  // Whether messages to and from `peer` go through shared memory.
  bool is_local(int peer) const {
    return peer >= 0 && peer < size_ && peer != rank_ && bases_[peer] != nullptr;
  }

  // The name this rank's segment was created under (unlinked once set-up returned).
  const std::string& segment_name() const { return own_name_; }
  // Whether the segments have no name (memfd, opened by peers through /proc/<pid>/fd or handed
  // to them over a socket), rather than a name in /dev/shm: see the constructor.
  bool anonymous() const { return anonymous_; }
  // Names of the segments this transport created and has not unlinked yet (empty once set-up
  // returned).
  std::vector<std::string> linked_segments() const;

 private:
  struct Segment;
  struct Fifo;

  // Why this rank's segment did not fit in /dev/shm (errno `err`), what it needs and the ways out.
  std::string no_room_message(int rank, int size, int err) const;
  Segment* segment(int owner) const;
  // Maps in advance the pages of `owner`'s segment (this rank's own included) that window ops
  // touch.
  void populate(int owner) const;
  Fifo* fifo(int receiver, int sender) const;
  uint8_t* slot(int receiver, int sender, uint64_t index) const;

  // `check` runs whenever the wait has made no progress for a while (each wake-up from a
  // sleep): it may throw to end the wait, as a found desync does.
  template <class Ready, class Check>
  void wait_until(WaitWord& word, Ready ready, int peer, const char* waiting_for,
                  const OpContext& op, const Deadline& dl, Check check);
  [[noreturn]] void throw_aborted(const OpContext& op) const;
  // Records that this rank is in `op` now, and on which CPU.
  void enter(const OpContext& op);
  void check_peer(int peer, const char* what) const;
  void ring(int owner);
  void unmap_all();
  // Whether `peer`'s process has died (see the lock in its segment's descriptor).
  bool peer_gone(int peer) const;

  // PeerWindow, over the window area of every segment.
  size_t capacity() const override { return cfg_.window_bytes; }
  uint8_t* begin(const MsgHeader& fp, const OpContext& op, size_t bytes) override;
  const uint8_t* buffer(int rank) const override;
  void publish() override;
  void wait_all(const OpContext& op, const Deadline& dl) override;
  // Why `peer` cannot be in the window op `fp` that this rank waits in: a message of another op
  // from it waits in this rank's inbox, or it sleeps waiting for a message from this rank. Empty
  // when neither.
  std::string message_op_of(int peer, const MsgHeader& fp) const;

  int rank_;
  int size_;
  ShmConfig cfg_;
  size_t slot_stride_ = 0;
  size_t fifo_stride_ = 0;
  size_t segment_bytes_ = 0;
  std::string own_name_;
  bool own_linked_ = false;
  bool anonymous_ = false;
  std::unique_ptr<FdServer> server_;  // hands out this rank's memfd during set-up
  uint64_t secret_ = 0;               // what a peer shows the server to be handed it
  std::vector<void*> bases_;        // bases_[r]: rank r's segment mapped here (ours included)
  std::vector<int> fds_;            // fds_[r]: its descriptor, kept open (ours locked shared)
  // Messages published to / released from each peer. 64-bit so that the slot index (count modulo
  // nslots) never jumps when a 32-bit count wraps; the shared counters carry the low 32 bits.
  std::vector<uint64_t> sent_;
  std::vector<uint64_t> received_;
  size_t window_offset_ = 0;   // where the window area starts in a segment
  size_t window_half_ = 0;     // one of its two halves, page-rounded
  uint64_t window_ops_ = 0;    // window ops begun here: the current one's header is this modulo 2
  size_t window_side_ = 0;     // the half the current op's region is in
  size_t window_at_ = 0;       // the current op's region, from window_offset_
  size_t window_next_ = 0;     // where the next op's region may start (in the current one's half)
  std::vector<size_t> peer_at_;  // each peer's region of the current op, once waited for
  uint32_t window_stamp_ = 0;  // phases this rank has published (the same count on every rank)
  MsgHeader window_fp_;        // the current window op's fingerprint
  uint64_t yields_to_peer_ = 0;
  // How long wait_until() spins now, between cfg_.spin and cfg_.spin_max.
  AdaptiveSpin spin_;
};

}  // namespace ringreduce

// Transports that carry device buffers, for a ring whose kernels run on a GPU.
//
// CudaIpcTransport, between ranks whose GPUs share a host (several ranks on one GPU included):
// every rank owns an inbox in device memory (one FIFO of slots per sender), exported with a CUDA
// IPC handle through the store and opened by every peer. The FIFO control (who may write which
// slot, who may read it) and the headers stay in host shared memory, in a ShmTransport whose
// slots hold headers only. So a slice moves exactly once, by a kernel of the sender (the ring's
// reduce or copy writes straight into the receiver's slot) and is read in place by a kernel of
// the receiver.
//
// Ordering across processes: the ring's thread queues kernels on its stream and the transport
// publishes a slot (send_end) or hands one back (recv_end) only after that stream has drained,
// so a peer that sees the slot published finds the data complete in device memory, and a sender
// never overwrites a slot a kernel of the receiver is still reading. Host-side publishing costs a
// stream synchronisation per message, which the slot size (megabytes) amortises.
//
// StagedTransport, for device buffers between ranks that CUDA IPC cannot join (other hosts): it
// wraps the group's host transport (TCP or shared memory) and stages each message through a
// device scratch slot and the host slot, one copy each way, overlapped with the network by the
// host transport's own FIFO depth.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/shm/shm_transport.h"
#include "transport/transport.h"

struct CUstream_st;

namespace ringreduce {

struct CudaIpcConfig {
  size_t slot_bytes = 8 << 20;  // device bytes of one slot (= largest slice)
  uint32_t nslots = 4;
  std::chrono::microseconds spin{20};
  std::chrono::microseconds spin_max{0};  // ShmConfig::spin_max of the control plane
  int device = 0;               // the rank's GPU
  CUstream_st* stream = nullptr;  // the stream the ring's kernels run on (owned by the caller)
};

// The CUDA transport could not be set up on some rank (no IPC between two of them, a peer on
// another host, out of device memory): every rank of the group throws it, with the same reason,
// so that all of them fall back to the same path.
class CudaIpcUnavailable : public Error {
 public:
  using Error::Error;
};

// Both device transports move payloads their own way but leave the group's control (doorbells,
// aborts, where each rank stands) to a host transport: control() is that transport's.
class CudaIpcTransport final : public Transport {
 public:
  // Collective over the group, like ShmTransport's constructor.
  CudaIpcTransport(Bootstrap& bootstrap, const std::string& prefix, int rank, int size,
                   const CudaIpcConfig& cfg);
  ~CudaIpcTransport() override;
  CudaIpcTransport(const CudaIpcTransport&) = delete;
  CudaIpcTransport& operator=(const CudaIpcTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t max_payload() const override { return cfg_.slot_bytes; }

  void* send_begin(int peer, const OpContext& op, const Deadline& dl) override;
  void send_end(int peer, const MsgHeader& hdr) override;
  const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op, const Deadline& dl) override;
  void recv_end(int peer) override;
  void* try_send_begin(int peer) override;
  const void* try_recv_begin(int peer, MsgHeader* hdr) override;

  GroupControl& control() const override { return ctl_->control(); }

  std::vector<std::string> linked_segments() const { return ctl_->linked_segments(); }

 private:
  uint8_t* send_slot(int peer) const;
  uint8_t* recv_slot(int peer) const;
  void drain(const char* why, int peer);  // waits for the stream; throws on a CUDA error

  int rank_;
  int size_;
  CudaIpcConfig cfg_;
  std::unique_ptr<ShmTransport> ctl_;
  size_t fifo_bytes_ = 0;
  uint8_t* inbox_ = nullptr;          // this rank's inbox, cudaMalloc'ed and owned here
  std::vector<uint8_t*> peers_;       // peers_[p]: rank p's inbox opened through IPC (owned here)
};

class StagedTransport final : public Transport {
 public:
  // `host` is the group's host transport (outlives this); `device`, `stream` as in CudaIpcConfig.
  StagedTransport(Transport& host, int device, CUstream_st* stream);
  ~StagedTransport() override;
  StagedTransport(const StagedTransport&) = delete;
  StagedTransport& operator=(const StagedTransport&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  size_t max_payload() const override { return host_.max_payload(); }
  void* send_begin(int peer, const OpContext& op, const Deadline& dl) override;
  void send_end(int peer, const MsgHeader& hdr) override;
  const void* recv_begin(int peer, MsgHeader* hdr, const OpContext& op, const Deadline& dl) override;
  void recv_end(int peer) override;
  // The point-to-point engine never runs over device buffers.
  void* try_send_begin(int peer) override;
  const void* try_recv_begin(int peer, MsgHeader* hdr) override;
  GroupControl& control() const override { return host_.control(); }

 private:
  uint8_t* scratch(std::vector<uint8_t*>& v, int peer);

  Transport& host_;
  int device_;
  CUstream_st* stream_;
  std::vector<void*> host_send_;      // the host slot opened by send_begin, per peer
  std::vector<uint8_t*> send_scratch_;  // device slots, one per peer and direction (owned here)
  std::vector<uint8_t*> recv_scratch_;
};

}  // namespace ringreduce

#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "common/error.h"
#include "transport/cuda_ipc/ipc_util.h"

namespace ringreduce {

using ipc::check_cuda;
using ipc::DeviceScope;
using ipc::from_hex;
using ipc::to_hex;

CudaIpcTransport::CudaIpcTransport(Bootstrap& bs, const std::string& prefix, int rank, int size,
                                   const CudaIpcConfig& cfg)
    : rank_(rank), size_(size), cfg_(cfg) {
  RR_CHECK(cfg.slot_bytes >= 256 && cfg.slot_bytes % 256 == 0,
           "ringreduce cuda: slot size must be a multiple of 256 bytes, got ", cfg.slot_bytes);
  DeviceScope scope(cfg.device, rank);
  // The control plane. Probe, not Require: a peer on another host is a reason to fall back, and
  // every rank must learn that together (below) rather than fail alone.
  ShmConfig sc;
  sc.slot_bytes = 64;  // headers only
  sc.nslots = cfg.nslots;
  sc.spin = cfg.spin;
  sc.spin_max = cfg.spin_max;
  sc.external_payload_bytes = cfg.slot_bytes;
  ctl_ = std::make_unique<ShmTransport>(bs, prefix + "ctl/", rank, size, sc, ShmTransport::Reach::Probe);

  // Each rank sets up what it can and says whether it managed; a rank that failed says why, and
  // every rank reads every answer, so they all take the same path.
  std::string why;
  for (int p = 0; p < size && why.empty(); ++p) {
    if (p != rank && !ctl_->is_local(p)) why = detail::cat("rank ", p, " is not on this host");
  }
  fifo_bytes_ = static_cast<size_t>(cfg.nslots) * cfg.slot_bytes;
  cudaIpcMemHandle_t handle{};
  if (why.empty()) {
    // Owned here: freed by the destructor, after the peers' mappings are closed on their side.
    void* mem = nullptr;
    const cudaError_t err = cudaMalloc(&mem, static_cast<size_t>(size) * fifo_bytes_);
    inbox_ = static_cast<uint8_t*>(mem);
    if (err != cudaSuccess) {
      cudaGetLastError();
      inbox_ = nullptr;
      why = detail::cat("rank ", rank, " could not allocate its ", size * fifo_bytes_ >> 20,
                        " MiB inbox on cuda:", cfg.device, ": ", cudaGetErrorString(err));
    } else if (cudaIpcGetMemHandle(&handle, inbox_) != cudaSuccess) {
      why = detail::cat("rank ", rank, " cannot export device memory through CUDA IPC: ",
                        cudaGetErrorString(cudaGetLastError()));
    }
  }
  bs.set(prefix + "ipc/handle/" + std::to_string(rank), why.empty() ? to_hex(&handle, sizeof handle) : "");
  peers_.assign(size, nullptr);
  for (int p = 0; p < size && why.empty(); ++p) {
    if (p == rank) continue;
    cudaIpcMemHandle_t h{};
    const std::string hex = bs.get(prefix + "ipc/handle/" + std::to_string(p));
    if (!from_hex(hex, &h, sizeof h)) {
      why = detail::cat("rank ", p, " exported no inbox");
      break;
    }
    void* ptr = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      why = detail::cat("rank ", rank, " cannot open rank ", p, "'s device memory through CUDA IPC: ",
                        cudaGetErrorString(err));
      break;
    }
    peers_[p] = static_cast<uint8_t*>(ptr);
  }
  bs.set(prefix + "ipc/ok/" + std::to_string(rank), why.empty() ? "ok" : why);
  std::string first;
  for (int p = 0; p < size; ++p) {
    const std::string v = p == rank ? (why.empty() ? "ok" : why) : bs.get(prefix + "ipc/ok/" + std::to_string(p));
    if (v != "ok" && first.empty()) first = v;
  }
  if (!first.empty()) {
    for (auto& ptr : peers_) {
      if (ptr != nullptr) cudaIpcCloseMemHandle(ptr);
      ptr = nullptr;
    }
    if (inbox_ != nullptr) cudaFree(inbox_);
    inbox_ = nullptr;
    throw CudaIpcUnavailable(first);
  }
}

CudaIpcTransport::~CudaIpcTransport() {
  DeviceScope scope(cfg_.device, rank_);
  cudaStreamSynchronize(cfg_.stream);
  for (uint8_t* p : peers_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
  }
  if (inbox_ != nullptr) cudaFree(inbox_);
}

uint8_t* CudaIpcTransport::send_slot(int peer) const {
  const uint64_t i = ctl_->sent(peer) % cfg_.nslots;
  return peers_[peer] + static_cast<size_t>(rank_) * fifo_bytes_ + i * cfg_.slot_bytes;
}

uint8_t* CudaIpcTransport::recv_slot(int peer) const {
  const uint64_t i = ctl_->received(peer) % cfg_.nslots;
  return inbox_ + static_cast<size_t>(peer) * fifo_bytes_ + i * cfg_.slot_bytes;
}

void CudaIpcTransport::drain(const char* why, int peer) {
  const cudaError_t err = cudaStreamSynchronize(cfg_.stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    const std::string msg = detail::cat("ringreduce cuda: rank ", rank_, ": a kernel failed before ",
                                        why, " rank ", peer, ": ", cudaGetErrorString(err));
    ctl_->abort_group(msg);  // the peer would otherwise wait for this message until its deadline
    throw Error(msg);
  }
}

void* CudaIpcTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  ctl_->send_begin(peer, op, dl);
  return send_slot(peer);
}

void CudaIpcTransport::send_end(int peer, const MsgHeader& hdr) {
  drain("publishing a slot to", peer);
  ctl_->send_end(peer, hdr);
}

const void* CudaIpcTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                         const Deadline& dl) {
  ctl_->recv_begin(peer, hdr, op, dl);
  return recv_slot(peer);
}

void CudaIpcTransport::recv_end(int peer) {
  drain("handing back a slot of", peer);
  ctl_->recv_end(peer);
}

void* CudaIpcTransport::try_send_begin(int peer) {
  return ctl_->try_send_begin(peer) ? send_slot(peer) : nullptr;
}

const void* CudaIpcTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  return ctl_->try_recv_begin(peer, hdr) ? recv_slot(peer) : nullptr;
}

// ---- StagedTransport ---------------------------------------------------------------------------

StagedTransport::StagedTransport(Transport& host, int device, CUstream_st* stream)
    : host_(host), device_(device), stream_(stream),
      host_send_(host.size(), nullptr), send_scratch_(host.size(), nullptr),
      recv_scratch_(host.size(), nullptr) {
  // Every slot now, not at first use: allocating may synchronise the device, which must not
  // happen while an op runs and a caller's stream waits for it.
  DeviceScope scope(device_, host_.rank());
  for (int p = 0; p < host_.size(); ++p) {
    if (p == host_.rank()) continue;
    scratch(send_scratch_, p);
    scratch(recv_scratch_, p);
  }
}

StagedTransport::~StagedTransport() {
  DeviceScope scope(device_, host_.rank());
  cudaStreamSynchronize(stream_);
  for (uint8_t* p : send_scratch_) {
    if (p != nullptr) cudaFree(p);
  }
  for (uint8_t* p : recv_scratch_) {
    if (p != nullptr) cudaFree(p);
  }
}

uint8_t* StagedTransport::scratch(std::vector<uint8_t*>& v, int peer) {
  if (v[peer] == nullptr) {
    // One slot per peer and direction, allocated on first use and owned here: a ring op has at
    // most one send and one receive open per peer.
    void* mem = nullptr;
    check_cuda(cudaMalloc(&mem, host_.max_payload()), "allocating a staging slot", host_.rank());
    v[peer] = static_cast<uint8_t*>(mem);
  }
  return v[peer];
}

void* StagedTransport::send_begin(int peer, const OpContext& op, const Deadline& dl) {
  host_send_[peer] = host_.send_begin(peer, op, dl);
  return scratch(send_scratch_, peer);
}

void StagedTransport::send_end(int peer, const MsgHeader& hdr) {
  if (hdr.bytes) {
    check_cuda(cudaMemcpyAsync(host_send_[peer], send_scratch_[peer], hdr.bytes,
                               cudaMemcpyDeviceToHost, stream_),
               "staging a message to the host", host_.rank());
  }
  check_cuda(cudaStreamSynchronize(stream_), "staging a message to the host", host_.rank());
  host_.send_end(peer, hdr);
}

const void* StagedTransport::recv_begin(int peer, MsgHeader* hdr, const OpContext& op,
                                        const Deadline& dl) {
  const void* src = host_.recv_begin(peer, hdr, op, dl);
  uint8_t* dst = scratch(recv_scratch_, peer);
  // hdr->bytes was bounded by the host transport; the ring checks the rest of the header.
  if (hdr->bytes) {
    check_cuda(cudaMemcpyAsync(dst, src, hdr->bytes, cudaMemcpyHostToDevice, stream_),
               "staging a message to the device", host_.rank());
  }
  return dst;
}

void StagedTransport::recv_end(int peer) {
  // The copy out of the host slot (and the kernels that read the scratch) must be done before
  // either is reused.
  check_cuda(cudaStreamSynchronize(stream_), "staging a message to the device", host_.rank());
  host_.recv_end(peer);
}

void* StagedTransport::try_send_begin(int peer) {
  (void)peer;
  throw Error("ringreduce cuda: point-to-point messages do not run over staged device buffers");
}

const void* StagedTransport::try_recv_begin(int peer, MsgHeader* hdr) {
  (void)peer;
  (void)hdr;
  throw Error("ringreduce cuda: point-to-point messages do not run over staged device buffers");
}

}  // namespace ringreduce

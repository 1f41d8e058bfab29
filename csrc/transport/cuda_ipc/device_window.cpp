#include "transport/cuda_ipc/device_window.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "common/error.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/ipc_util.h"

namespace ringreduce {

namespace {

constexpr size_t kControlBytes = 4096;
constexpr size_t kCounterStride = 64;  // one counter per 64-byte line: peers write them at once
constexpr size_t kAbortOffset = kControlBytes - kCounterStride;
static_assert(DeviceWindow::kMaxRanks * kCounterStride <= kAbortOffset + kCounterStride,
              "the counters and the abort word fit the control page");

// The driver's stream memory operations, looked up through the runtime so that the library links
// the runtime only (torch loads the driver itself).
using ValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
struct MemOps {
  ValueFn write = nullptr;
  ValueFn wait = nullptr;
  std::string why;  // why they are missing, when they are
};

const MemOps& mem_ops() {
  static MemOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    auto find = [](const char* name, ValueFn* fn) -> std::string {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
      if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr) {
        cudaGetLastError();
        return detail::cat("the CUDA driver has no ", name);
      }
      *fn = reinterpret_cast<ValueFn>(p);
      return "";
    };
    ops.why = find("cuStreamWriteValue32", &ops.write);
    if (ops.why.empty()) ops.why = find("cuStreamWaitValue32", &ops.wait);
  });
  return ops;
}

void check_driver(CUresult r, const char* what, int rank) {
  if (r == CUDA_SUCCESS) return;
  throw Error(detail::cat("ringreduce cuda: rank ", rank, ": ", what, " failed (CUresult ",
                          static_cast<int>(r), ")"));
}

}  // namespace

DeviceWindow::DeviceWindow(Bootstrap& bs, const std::string& prefix, int rank, int size,
                           size_t slot_bytes, int device)
    : rank_(rank), size_(size), slot_bytes_(slot_bytes), device_(device), peers_(size, nullptr) {
  RR_CHECK(slot_bytes >= 4096 && slot_bytes % 256 == 0,
           "ringreduce cuda: a window slot must be a multiple of 256 bytes and at least 4 KiB, got ",
           slot_bytes);
  ipc::DeviceScope scope(device, rank);
  // Each rank sets up what it can and says whether it managed; every rank reads every answer,
  // so that all of them keep or drop the window together.
  std::string why = size > kMaxRanks ? detail::cat("a group of ", size, " ranks (a window serves at most ",
                                                   kMaxRanks, ")")
                                     : mem_ops().why;
  // The abort stream first: the control page is cleared on it, and waited for, before any peer
  // can learn the page's handle (a clear queued on the legacy default stream could run after a
  // peer's first post, behind whatever the caller's work left there).
  if (why.empty()) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      why = detail::cat("rank ", rank, " could not create a stream: ", cudaGetErrorString(cudaGetLastError()));
    }
    side_ = s;
  }
  cudaIpcMemHandle_t handle{};
  if (why.empty()) {
    void* mem = nullptr;
    const size_t bytes = kControlBytes + 2 * slot_bytes;
    cudaError_t err = cudaMalloc(&mem, bytes);
    if (err == cudaSuccess) err = cudaMemsetAsync(mem, 0, kControlBytes, side_);
    if (err == cudaSuccess) err = cudaStreamSynchronize(side_);
    if (err == cudaSuccess) err = cudaIpcGetMemHandle(&handle, mem);
    own_ = static_cast<uint8_t*>(mem);
    if (err != cudaSuccess) {
      cudaGetLastError();
      why = detail::cat("rank ", rank, " could not set up its ", bytes >> 20, " MiB device window on cuda:",
                        device, ": ", cudaGetErrorString(err));
    }
  }
  bs.set(prefix + "handle/" + std::to_string(rank), why.empty() ? ipc::to_hex(&handle, sizeof handle) : "");
  for (int p = 0; p < size && why.empty(); ++p) {
    if (p == rank) continue;
    cudaIpcMemHandle_t h{};
    if (!ipc::from_hex(bs.get(prefix + "handle/" + std::to_string(p)), &h, sizeof h)) {
      why = detail::cat("rank ", p, " exported no device window");
      break;
    }
    void* ptr = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      why = detail::cat("rank ", rank, " cannot open rank ", p, "'s device window: ", cudaGetErrorString(err));
      break;
    }
    peers_[p] = static_cast<uint8_t*>(ptr);
  }
  bs.set(prefix + "ok/" + std::to_string(rank), why.empty() ? "ok" : why);
  std::string first;
  for (int p = 0; p < size; ++p) {
    const std::string v = p == rank ? (why.empty() ? "ok" : why) : bs.get(prefix + "ok/" + std::to_string(p));
    if (v != "ok" && first.empty()) first = v;
  }
  if (!first.empty()) {
    for (uint8_t*& ptr : peers_) {
      if (ptr != nullptr) cudaIpcCloseMemHandle(ptr);
      ptr = nullptr;
    }
    if (own_ != nullptr) cudaFree(own_);
    if (side_ != nullptr) cudaStreamDestroy(side_);
    throw CudaIpcUnavailable(first);
  }
}

DeviceWindow::~DeviceWindow() {
  try {
    ipc::DeviceScope scope(device_, rank_);
    cudaStreamSynchronize(side_);
    for (uint8_t* p : peers_) {
      if (p != nullptr) cudaIpcCloseMemHandle(p);
    }
    // Freed only once every peer has closed its mapping (keep_memory() otherwise): freeing memory
    // that another process still maps is undefined.
    if (free_own_) cudaFree(own_);
    cudaStreamDestroy(side_);
  } catch (...) {
    // A destructor reports nothing: the device is going away with the process or the group.
  }
}

void* DeviceWindow::slot(int r, int which) const {
  return base(r) + kControlBytes + static_cast<size_t>(which & 1) * slot_bytes_;
}

void DeviceWindow::post(uint32_t seq, CUstream_st* s) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(peers_[p] + static_cast<size_t>(rank_) * kCounterStride);
    // The default flags put a memory fence before the write: what the stream wrote before (this
    // rank's staged input) is visible to the peer once it sees the counter.
    check_driver(mem_ops().write(s, addr, seq, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32", rank_);
  }
}

void DeviceWindow::wait_peers(uint32_t seq, CUstream_st* s) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(own_ + static_cast<size_t>(p) * kCounterStride);
    check_driver(mem_ops().wait(s, addr, seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32", rank_);
  }
}

const volatile uint32_t* DeviceWindow::abort_word() const {
  return reinterpret_cast<const volatile uint32_t*>(own_ + kAbortOffset);
}

void DeviceWindow::abort(uint32_t through) {  // exit-ok: releases the window's waits
  ipc::DeviceScope scope(device_, rank_);
  // Every rank's abort word, this one's first: kernels and staging copies queued behind a wait
  // read it, here and on the peers, whose own waits may pass on what this rank still posts.
  check_driver(mem_ops().write(side_, reinterpret_cast<CUdeviceptr>(own_ + kAbortOffset), 1,
                               CU_STREAM_WRITE_VALUE_DEFAULT),
               "cuStreamWriteValue32 (abort)", rank_);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    check_driver(mem_ops().write(side_, reinterpret_cast<CUdeviceptr>(peers_[p] + kAbortOffset), 1,
                                 CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32 (abort)", rank_);
  }
  // Then this rank's own waits pass.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(own_ + static_cast<size_t>(p) * kCounterStride);
    check_driver(mem_ops().write(side_, addr, through, CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32 (abort)", rank_);
  }
}

}  // namespace ringreduce

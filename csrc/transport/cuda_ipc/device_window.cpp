#include "transport/cuda_ipc/device_window.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>

#include "common/error.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/ipc_util.h"

namespace ringreduce {

namespace {

using window::kAbortOffset;
using window::kControlBytes;
using window::kLine;
using window::kSemOffset;
using window::kTurnOffset;

// A released wait's semaphore: far above any number of posts a rank can have outstanding, and
// still far from wrapping after every later admit took one.
constexpr uint32_t kReleased = 1u << 30;

// This process's device index for `pci` (a peer's GPU), or -1 where it cannot see that GPU.
int device_of(const std::string& pci) {
  int d = -1;
  if (pci.empty() || cudaDeviceGetByPCIBusId(&d, pci.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

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
  // The admits' report of a disagreement, in host memory the device writes and the watchdog reads.
  if (why.empty()) {
    void* h = nullptr;
    if (cudaHostAlloc(&h, sizeof(window::Mismatch), cudaHostAllocMapped) != cudaSuccess) {
      cudaGetLastError();
      why = detail::cat("rank ", rank, " could not allocate mapped host memory");
    } else {
      mismatch_.reset(static_cast<window::Mismatch*>(h), [](window::Mismatch* m) { cudaFreeHost(m); });
      *mismatch_ = window::Mismatch{};
    }
  }
  char pci[32] = "";
  if (why.empty() && cudaDeviceGetPCIBusId(pci, sizeof pci, device) != cudaSuccess) {
    cudaGetLastError();
    pci[0] = 0;
  }
  bs.set(prefix + "pci/" + std::to_string(rank), pci);
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
    // Posts are atomic adds into a peer's page: a peer on another GPU must take them natively.
    const int pd = device_of(bs.get(prefix + "pci/" + std::to_string(p)));
    if (pd == device) shares_gpu_ = true;
    int atomics = pd == device ? 1 : 0;
    if (pd >= 0 && pd != device &&
        cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, pd) != cudaSuccess) {
      cudaGetLastError();
      atomics = 0;
    }
    if (!atomics) {
      why = detail::cat("rank ", rank, "'s GPU has no native atomics into rank ", p, "'s GPU");
      break;
    }
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
    mismatch_.reset();
    if (side_ != nullptr) cudaStreamDestroy(side_);
    throw CudaIpcUnavailable(first);
  }
  for (int r = 0; r < size; ++r) bases_.base[r] = base(r);
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
    mismatch_.reset();  // freed by the last op end that holds it
    cudaStreamDestroy(side_);
  } catch (...) {
    // A destructor reports nothing: the device is going away with the process or the group.
  }
}

void* DeviceWindow::slot(int r, int which) const {
  return base(r) + kControlBytes + static_cast<size_t>(which & 1) * slot_bytes_;
}

const volatile uint32_t* DeviceWindow::turn_word() const {
  return reinterpret_cast<const volatile uint32_t*>(own_ + kTurnOffset);
}

void DeviceWindow::post(const window::Print& print, CUstream_st* s) {
  window::post(bases_, rank_, size_, print, s);
}

void DeviceWindow::wait_peers(CUstream_st* s) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(own_ + kSemOffset + static_cast<size_t>(p) * kLine);
    check_driver(mem_ops().wait(s, addr, 1, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32", rank_);
  }
}

void DeviceWindow::admit(CUstream_st* s) { window::admit(bases_, rank_, size_, mismatch_.get(), s); }

const volatile uint32_t* DeviceWindow::abort_word() const {
  return reinterpret_cast<const volatile uint32_t*>(own_ + kAbortOffset);
}

bool DeviceWindow::mismatch(window::Mismatch* out) const {
  const auto* m = static_cast<const volatile window::Mismatch*>(mismatch_.get());
  if (m->flag == 0) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  out->flag = m->flag;
  out->peer = m->peer;
  out->mine = window::Print{m->mine.count, m->mine.meta, m->mine.tag};
  out->theirs = window::Print{m->theirs.count, m->theirs.meta, m->theirs.tag};
  return true;
}

void DeviceWindow::abort() {  // exit-ok: releases the window's waits
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
  // Then this rank's waits pass, those queued and those still to come (a graph replayed later).
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const auto addr = reinterpret_cast<CUdeviceptr>(own_ + kSemOffset + static_cast<size_t>(p) * kLine);
    check_driver(mem_ops().write(side_, addr, kReleased, CU_STREAM_WRITE_VALUE_DEFAULT),
                 "cuStreamWriteValue32 (abort)", rank_);
  }
}

}  // namespace ringreduce

#include "transport/cuda_ipc/window_kernels.h"

#include <cuda_runtime.h>

#include "common/error.h"

namespace ringreduce {
namespace window {

namespace {

__device__ __forceinline__ volatile uint32_t* word(uint8_t* base, size_t offset) {
  return reinterpret_cast<volatile uint32_t*>(base + offset);
}

__device__ __forceinline__ volatile Print* print_of(uint8_t* base, uint32_t turn) {
  return reinterpret_cast<volatile Print*>(base + kPrintOffset + (turn & 1u) * kLine);
}

__global__ void post_kernel(Bases b, int rank, int size, Print print) {
  uint8_t* own = b.base[rank];
  volatile Print* mine = print_of(own, *word(own, kTurnOffset));
  mine->count = print.count;
  mine->meta = print.meta;
  mine->tag = print.tag;
  // Peers on other GPUs of the host read the staged input and the Print over the link.
  __threadfence_system();
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    atomicAdd_system(reinterpret_cast<unsigned*>(b.base[p] + kSemOffset + size_t(rank) * kLine), 1u);
  }
}

__global__ void admit_kernel(Bases b, int rank, int size, Mismatch* mismatch) {
  uint8_t* own = b.base[rank];
  const uint32_t turn = *word(own, kTurnOffset);
  const volatile Print* mine = print_of(own, turn);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    atomicSub_system(reinterpret_cast<unsigned*>(own + kSemOffset + size_t(p) * kLine), 1u);
    const volatile Print* theirs = print_of(b.base[p], turn);
    if (theirs->count == mine->count && theirs->meta == mine->meta) continue;
    if (mismatch->flag == 0) {
      mismatch->peer = p;
      mismatch->mine = Print{mine->count, mine->meta, mine->tag};
      mismatch->theirs = Print{theirs->count, theirs->meta, theirs->tag};
      __threadfence_system();
      *reinterpret_cast<volatile uint32_t*>(&mismatch->flag) = 1;
    }
    *word(own, kAbortOffset) = 2;
  }
  __threadfence();
  *word(own, kTurnOffset) = turn + 1;
}

void check_launch(const char* what, int rank) {
  const cudaError_t err = cudaGetLastError();
  RR_CHECK(err == cudaSuccess, "ringreduce cuda window ", what, ": rank ", rank,
           ": kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void post(const Bases& b, int rank, int size, Print print, CUstream_st* s) {
  post_kernel<<<1, 1, 0, s>>>(b, rank, size, print);
  check_launch("post", rank);
}

void admit(const Bases& b, int rank, int size, Mismatch* mismatch, CUstream_st* s) {
  admit_kernel<<<1, 1, 0, s>>>(b, rank, size, mismatch);
  check_launch("admit", rank);
}

}  // namespace window
}  // namespace ringreduce

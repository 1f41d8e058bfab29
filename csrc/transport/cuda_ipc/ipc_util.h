// What the CUDA IPC pieces of this directory share: CUDA errors as ringreduce errors, IPC handles
// as store strings, and a scoped device. Host code over the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace ringreduce {
namespace ipc {

// Throws ringreduce::Error naming what failed, with CUDA's own words for why.
inline void check_cuda(cudaError_t err, const char* what, int rank) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clears a sticky launch error so that the next call reports its own
  throw Error(detail::cat("ringreduce cuda: rank ", rank, ": ", what, ": ", cudaGetErrorString(err)));
}

inline std::string to_hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const uint8_t*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

inline bool from_hex(const std::string& s, void* p, size_t n) {
  if (s.size() != 2 * n) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nib(s[2 * i]), lo = nib(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

// Sets the calling thread's device for the span of a call (the ring's thread may serve a CPU
// group in between, and torch's own device guard is not ours to rely on here).
class DeviceScope {
 public:
  DeviceScope(int device, int rank) {
    check_cuda(cudaGetDevice(&saved_), "cudaGetDevice", rank);
    if (saved_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice", rank);
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace ipc
}  // namespace ringreduce

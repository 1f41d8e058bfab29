// The direct ops' C++ entry for benchmarks (the ops themselves are registered with the dispatcher
// in direct_ops.cpp and have no other C++ interface).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace ringreduce {

// Calls torch.ops.ringreduce.all_reduce_(t, "sum", group) `iters` times from C++, through the
// dispatcher as a C++ program would, and returns the seconds they took in all: the op's own cost,
// without the Python interpreter's per call (python -m benchmarks/peers.py, the rr-c++ column).
double time_all_reduce(at::Tensor t, int64_t iters, const std::string& group);

// Calls the backend of process group `group` for t's device ('' for the default group; any
// backend, torch's fake one included; the caller holds the GIL for one written in Python) `iters` times, allreduce([t]) with asyncOp = `async_op` then wait(), and
// returns the seconds they took in all: what a backend costs per op below torch's own layers
// (benchmarks/call_path.py's sync-c++ and async-c++ rows, beside the fake process group's).
double time_backend_all_reduce(at::Tensor t, int64_t iters, const std::string& group, bool async_op);

}  // namespace ringreduce

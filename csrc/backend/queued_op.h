// A host or CUDA op issued through RingBackend::enqueue(): its Work and what runs it once its
// turn comes, in one allocation. The queue's task for it is two pointers (the backend and this),
// which std::function keeps in place: an async op, whose queued form is all of its cost beyond a
// synchronous one's, allocates no closure, no shared pins and no map node. In a header of its own
// because bindings.cpp registers it with pybind11 (see RingWork's registration there).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "backend/cuda_side.h"
#include "backend/work.h"

namespace ringreduce {

class QueuedOp final : public RingWork {
 public:
  using RingWork::RingWork;
  RingBody body;
  std::function<void(const OpContext&, const Deadline&)> run;  // a CUDA op's (CudaSide::prepare)
  std::chrono::milliseconds timeout{0};
  std::string traced;  // what a TRACE line says of the op; empty when none is written

 private:
  // Called by complete(), after the body has returned (or never ran): its tensors go with it.
  void release_op() override {
    body = nullptr;
    run = nullptr;
  }
};

}  // namespace ringreduce

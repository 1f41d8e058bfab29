// Point-to-point calls of RingBackend (send, recv, recvAnysource): checked here, then handed to
// the p2p engine on a channel of their own, outside the op queue (p2p/p2p.h).
#include "backend/ring_backend.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <memory>
#include <utility>

#include "backend/storage_pins.h"
#include "backend/tensor_checks.h"
#include "p2p/p2p.h"

namespace ringreduce {

namespace {

// The p2p engine's completion: copy a strided receive back, name the source, complete the Work.
// `pins` keeps the storages the engine writes or reads in place until then (see StoragePins).
P2p::Done p2p_done(c10::intrusive_ptr<RingWork> work, at::Tensor user, at::Tensor buf) {
  const std::vector<at::Tensor> used{user, buf};
  auto pins = std::make_shared<StoragePins>(std::initializer_list<const std::vector<at::Tensor>*>{&used});
  return [work = std::move(work), user = std::move(user), buf = std::move(buf), pins](
             std::exception_ptr error, int source) mutable {
    if (!error && !user.is_same(buf)) {
      try {
        at::NoGradGuard no_grad;
        // A CUDA tensor's data came through host memory: copied to its device here, and
        // synchronously, so that the Work completes with it in place.
        c10::OptionalDeviceGuard on_device(user.device());
        user.copy_(buf);
      } catch (...) {
        error = std::current_exception();
      }
    }
    pins.reset();
    work->set_source_rank(source);
    work->complete(error ? as_dist_error(error) : nullptr);
  };
}

}  // namespace

c10::intrusive_ptr<c10d::Work> RingBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                 int tag) {
  const char* name = "send";
  const at::Tensor& t = single_tensor(tensors, name, rank_);
  check_peer(dstRank, rank_, size_, name, "destination");
  // A strided tensor travels from a private contiguous copy, taken now; a CUDA tensor through
  // host memory (point-to-point messages run on the host transport), copied now, once the
  // caller's stream has produced it.
  at::Tensor buf = t.is_cuda() ? t.to(at::kCPU) : t.is_contiguous() ? t : t.contiguous();
  auto work = c10::make_intrusive<RingWork>(rank_, c10d::OpType::SEND, name, next_p2p_seq_++,
                                            std::vector<at::Tensor>{t}, queue_.state());
  try {
    p2p_->send(buf.data_ptr(), buf.nbytes(), static_cast<uint8_t>(t.scalar_type()), dstRank, tag,
               current_timeout(), p2p_done(work, buf, buf));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::p2p_recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag, const char* name) {
  const at::Tensor& t = single_tensor(tensors, name, rank_);
  if (src != -1) check_peer(src, rank_, size_, name, "source");
  // Data lands straight in a contiguous CPU tensor; a strided or CUDA one gets it on success only.
  at::Tensor buf = t.is_cuda() ? at::empty(t.sizes(), t.options().device(at::kCPU))
                   : t.is_contiguous() ? t : at::empty(t.sizes(), t.options());
  auto work = c10::make_intrusive<RingWork>(rank_, c10d::OpType::RECV, name, next_p2p_seq_++,
                                            std::vector<at::Tensor>{t}, queue_.state());
  try {
    p2p_->recv(buf.data_ptr(), buf.nbytes(), static_cast<uint8_t>(t.scalar_type()), src, tag,
               current_timeout(), p2p_done(work, t, buf));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> RingBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                 int tag) {
  return p2p_recv(tensors, srcRank, tag, "recv");
}

c10::intrusive_ptr<c10d::Work> RingBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  return p2p_recv(tensors, -1, tag, "recvAnysource");
}

}  // namespace ringreduce

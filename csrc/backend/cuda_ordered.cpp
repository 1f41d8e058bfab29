#include "backend/cuda_ordered.h"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <vector>

#include "common/error.h"
#include "common/log.h"

namespace ringreduce {

using Clock = std::chrono::steady_clock;

// cudaEvent_t's, reused: creating one per op costs about as much as queueing the op. Shared by
// the ops' ends, which may outlive the group (a Work kept by the caller).
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaEvent_t get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

namespace {

// Shared by an op's Work and the watchdog: the op's end and, if it failed, why.
struct OpEnd {
  OpEnd(std::shared_ptr<EventPool> p, c10::DeviceIndex d) : pool(std::move(p)), device(d), done(pool->get()) {}
  ~OpEnd() { pool->put(done); }
  OpEnd(const OpEnd&) = delete;
  OpEnd& operator=(const OpEnd&) = delete;

  // cudaSuccess once the op has ended on the device, cudaErrorNotReady before, else the error
  // that stopped the device's work.
  cudaError_t status() const { return cudaEventQuery(done); }
  bool has_failed() const { return failed_flag.load(std::memory_order_acquire); }
  std::string failed() {
    if (!has_failed()) return "";
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = why;
    failed_flag.store(true, std::memory_order_release);
  }

  std::shared_ptr<EventPool> pool;
  c10::DeviceIndex device;
  cudaEvent_t done;
  std::mutex mu;
  std::string error;  // set once, by the watchdog
  std::atomic<bool> failed_flag{false};
};

class OrderedWork final : public c10d::Work {
 public:
  OrderedWork(int rank, uint64_t seq, std::vector<at::Tensor> outputs, std::shared_ptr<OpEnd> end,
              c10::cuda::CUDAStream comm)
      : c10d::Work(rank, c10d::OpType::ALLREDUCE), seq_(seq), outputs_(std::move(outputs)),
        end_(std::move(end)), comm_(comm) {}

  bool isCompleted() override { return end_->has_failed() || end_->status() != cudaErrorNotReady; }
  bool isSuccess() const override { return !end_->has_failed(); }
  std::exception_ptr exception() const override {
    const std::string why = end_->failed();
    if (why.empty()) return nullptr;
    try {
      C10_THROW_ERROR(DistBackendError, why);
    } catch (...) {
      return std::current_exception();
    }
  }
  bool wait(std::chrono::milliseconds) override {
    raise_if_failed();
    synchronize();
    return true;
  }
  void synchronize() override {
    C10_CUDA_CHECK(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(end_->device).stream(), end_->done, 0));
  }
  // Made at the first ask (most callers never ask), completed on the op's stream: a wait on it
  // orders the waiter's streams after the op (and whatever the group queued since), as NCCL's.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(future_mu_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{comm_.device()});
      if (std::exception_ptr e = exception()) {
        future_->setError(e);
      } else {
        c10::cuda::CUDAStreamGuard guard(comm_);
        future_->markCompleted(c10::IValue(outputs_));
      }
    }
    return future_;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }

 private:
  void raise_if_failed() {
    const std::string why = end_->failed();
    if (!why.empty()) C10_THROW_ERROR(DistBackendError, why);
  }

  uint64_t seq_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<OpEnd> end_;
  c10::cuda::CUDAStream comm_;
  std::mutex future_mu_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

struct CudaOrdered::Pending {
  const char* name;
  uint64_t seq;
  int rank;
  std::chrono::milliseconds timeout;
  Clock::time_point deadline;
  std::shared_ptr<OpEnd> end;
};

CudaOrdered::CudaOrdered(std::unique_ptr<DeviceWindow> window, Transport& host,
                         std::function<void(uint64_t, const std::string&)> finished)
    : window_(std::move(window)), events_(std::make_shared<EventPool>()), oneshot_(*window_), host_(host),
      finished_(std::move(finished)) {
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  watchdog_ = std::thread([this] { watch(); });
}

CudaOrdered::~CudaOrdered() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  cudaEventDestroy(ready_);
}

bool CudaOrdered::takes_allreduce(RedOp, int64_t divisor) const {
  return window_->size() <= DeviceOneShot::kMaxRanks && divisor <= 1;
}

c10::intrusive_ptr<c10d::Work> CudaOrdered::allreduce(const char* name, uint64_t seq, int rank,
                                                      const at::Tensor& in, const at::Tensor& out,
                                                      const at::Tensor& result, DType t, RedOp op,
                                                      std::chrono::milliseconds timeout,
                                                      c10::cuda::CUDAStream comm,
                                                      c10::cuda::CUDAStream caller) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A group whose host side a peer aborted queues nothing more on the device: its window is
    // aborted here first, so that nothing this rank already queued reduces a stale slot.
    const std::string host = host_.abort_reason();
    if (aborted_.empty() && !host.empty()) fail_all(host);
    if (!aborted_.empty()) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat(op_prefix(name, seq, rank), "the group was aborted: ", aborted_));
    }
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(caller.stream(), &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone) {
    C10_THROW_ERROR(DistBackendError,
                    detail::cat(op_prefix(name, seq, rank),
                                "cannot be captured in a CUDA graph: its ranks order each op through ",
                                "counters that a replay would repeat (docs/cuda.md)"));
  }
  auto end = std::make_shared<OpEnd>(events_, comm.device_index());
  bool wake;
  {
    // The caching allocator must not hand these out while the op's stream may still use them.
    in.record_stream(comm);
    if (!out.is_same(in)) out.record_stream(comm);
    std::lock_guard<std::mutex> lock(mu_);  // one queueing at a time: ops keep their order
    // The op starts after what the caller's stream has queued (its input's producers). One event
    // serves every op: a stream wait takes the event as it is when the wait is queued.
    C10_CUDA_CHECK(cudaEventRecord(ready_, caller.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(comm.stream(), ready_, 0));
    oneshot_.allreduce(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), t, op, 1,
                       comm.stream());
    C10_CUDA_CHECK(cudaEventRecord(end->done, comm.stream()));
    auto p = std::make_shared<Pending>();
    p->name = name;
    p->seq = seq;
    p->rank = rank;
    p->timeout = timeout;
    p->deadline = Clock::now() + timeout;
    p->end = end;
    // The watchdog sleeps without a timeout only when nothing is in flight: wake it then alone.
    wake = pending_.empty();
    pending_.push_back(std::move(p));
  }
  if (wake) cv_.notify_all();
  return c10::make_intrusive<OrderedWork>(rank, seq, std::vector<at::Tensor>{result}, end, comm);
}

std::string CudaOrdered::abort_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

void CudaOrdered::abort(const std::string& why) {  // exit-ok: ends the group's device ops, not the process
  std::lock_guard<std::mutex> lock(mu_);
  fail_all(why);
}

void CudaOrdered::quiesce() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_.empty(); });
}

void CudaOrdered::keep_window_memory() { window_->keep_memory(); }

void CudaOrdered::fail_all(const std::string& why) {
  if (aborted_.empty()) {
    aborted_ = why;
    try {
      window_->abort(oneshot_.last_seq());  // exit-ok: the window's, not the process
    } catch (const std::exception& e) {
      log::note(window_->rank(), detail::cat("could not release the device's queued waits: ", e.what()));
    }
  }
  for (auto& p : pending_) {
    const std::string msg = detail::cat(op_prefix(p->name, p->seq, p->rank), why);
    p->end->fail(msg);
    finished_(p->seq, msg);
  }
  pending_.clear();
  cv_.notify_all();
}

void CudaOrdered::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point next_liveness = Clock::now();
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing in flight
    // A peer's abort first: an op that ended after it may have read a slot the peer no longer
    // filled, so nothing in flight then counts as done.
    std::string why = host_.abort_reason();
    if (!why.empty()) {
      fail_all(why);
      continue;
    }
    // The oldest op first: ops end in order on the one stream.
    cudaError_t st = cudaErrorNotReady;
    while (!pending_.empty() && (st = pending_.front()->end->status()) == cudaSuccess) {
      finished_(pending_.front()->seq, "");
      pending_.pop_front();
    }
    if (pending_.empty()) {
      cv_.notify_all();  // quiesce() waits for this
      continue;
    }
    const Pending& p = *pending_.front();
    if (st != cudaErrorNotReady) {
      cudaGetLastError();
      why = detail::cat("the device failed: ", cudaGetErrorString(st));
    }
    if (why.empty() && Clock::now() >= next_liveness) {
      next_liveness = Clock::now() + std::chrono::milliseconds(100);
      for (int r = 0; r < window_->size() && why.empty(); ++r) {
        if (r == window_->rank()) continue;
        const std::string lost = host_.peer_lost(r);
        if (!lost.empty()) why = detail::cat("rank ", r, " is gone (", lost, ")");
      }
    }
    if (why.empty() && Clock::now() >= p.deadline) {
      why = detail::cat("did not end on the device within ", p.timeout.count(),
                        " ms: a peer has not queued its part of it (or of an earlier stream-ordered op)");
    }
    if (!why.empty()) {
      host_.abort_group(detail::cat("rank ", p.rank, ": ", p.name, " #", p.seq, ": ", why));
      fail_all(why);
      continue;
    }
    if (stopping_ && pending_.empty()) return;
    cv_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

}  // namespace ringreduce

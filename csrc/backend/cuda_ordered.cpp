#include "backend/cuda_ordered.h"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common/deadline.h"
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
  OpEnd(std::shared_ptr<EventPool> p, c10::DeviceIndex d, std::shared_ptr<const window::Mismatch> m, uint32_t t)
      : pool(std::move(p)), device(d), done(pool->get()), mismatch(std::move(m)), tag(t) {}
  ~OpEnd() { pool->put(done); }
  OpEnd(const OpEnd&) = delete;
  OpEnd& operator=(const OpEnd&) = delete;

  // cudaSuccess once the op has ended on the device, cudaErrorNotReady before, else the error
  // that stopped the device's work.
  cudaError_t status() const { return cudaEventQuery(done); }
  bool has_failed() const { return failed_flag.load(std::memory_order_acquire); }
  // The ranks' calls disagreed in this op's turns or before (found on the device, before the end
  // event): the op wrote nothing and fails, once the watchdog has said why.
  bool rejected() const { return DeviceWindow::rejects(*mismatch, tag); }
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
  std::shared_ptr<const window::Mismatch> mismatch;
  uint32_t tag;
  std::mutex mu;
  std::string error;  // set once, by the watchdog
  std::atomic<bool> failed_flag{false};
};

class OrderedWork final : public c10d::Work {
 public:
  OrderedWork(int rank, uint64_t seq, std::vector<at::Tensor> outputs, std::shared_ptr<OpEnd> end,
              c10::cuda::CUDAStream comm, bool captured)
      : c10d::Work(rank, c10d::OpType::ALLREDUCE), seq_(seq), outputs_(std::move(outputs)),
        end_(std::move(end)), comm_(comm), captured_(captured) {}

  // A captured op runs only when its graph is replayed: nothing of it is pending here (and its
  // end event, recorded in the capture, must not be queried).
  bool isCompleted() override {
    return captured_ || end_->has_failed() || (end_->status() != cudaErrorNotReady && !end_->rejected());
  }
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
    // An op the device rejected has ended without writing: its error comes from the watchdog,
    // within a millisecond or so.
    if (!captured_ && end_->rejected()) {
      const Deadline dl = Deadline::after(std::chrono::seconds(5));
      while (!end_->has_failed() && !dl.passed()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
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
  bool captured_;
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

CudaOrdered::CudaOrdered(std::unique_ptr<DeviceWindow> window, GroupControl& host,
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
  // Inside a CUDA graph's capture the op is queued into the graph, exactly as at a call: it is
  // ordered between the ranks through the window's semaphores and turn counter, which a replay
  // advances on the device. The caller's wait() (a synchronous call makes it) joins the group's
  // stream back into the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(caller.stream(), &capture));
  const bool captured = capture != cudaStreamCaptureStatusNone;
  auto end = std::make_shared<OpEnd>(events_, comm.device_index(), window_->mismatch_record(),
                                     static_cast<uint32_t>(seq));
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
                       static_cast<uint32_t>(seq), comm.stream());
    C10_CUDA_CHECK(cudaEventRecord(end->done, comm.stream()));
    if (captured) {
      // Joined back into the capture at once, whether or not the caller waits before it ends.
      C10_CUDA_CHECK(cudaStreamWaitEvent(caller.stream(), end->done, 0));
      // Its replays run with no host code: the watchdog keeps an eye on the peers from now on,
      // so that a replay waiting for a dead peer is released (docs/cuda.md).
      wake = !replays_;
      if (!replays_ && rank == 0 && window_->shares_gpu()) {
        log::note(rank, "a CUDA graph captured an all-reduce of ranks that share a GPU: without MPS, each "
                        "replayed all-reduce waits out a time slice of the GPU (about 2 ms), as a waiting "
                        "graph does not yield it; under MPS a replay takes less than a call (docs/cuda.md)");
      }
      replays_ = true;
      finished_(seq, "");
    } else {
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
  }
  if (wake) cv_.notify_all();
  return c10::make_intrusive<OrderedWork>(rank, seq, std::vector<at::Tensor>{result}, end, comm, captured);
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
  // The group is going away: its peers may leave before this rank's window does, and that is no
  // fault of a replay.
  closing_ = true;
  cv_.wait(lock, [&] { return pending_.empty(); });
}

bool CudaOrdered::captured() const {
  std::lock_guard<std::mutex> lock(mu_);
  return replays_;
}

void CudaOrdered::keep_window_memory() { window_->keep_memory(); }

void CudaOrdered::fail_all(const std::string& why) {
  if (aborted_.empty()) {
    aborted_ = why;
    try {
      window_->abort();  // exit-ok: the window's, not the process
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

std::string CudaOrdered::disagreement() const {
  window::Mismatch m;
  if (!window_->mismatch(&m)) return "";
  auto call = [](const window::Print& p) {
    return detail::cat("has ", p.count, " elements of ", dtype_name(DeviceOneShot::dtype_of(p.meta)), " with ",
                       redop_name(DeviceOneShot::op_of(p.meta)), " (its allreduce #", p.tag, ")");
  };
  return detail::cat("the ranks called different all-reduces: rank ", window_->rank(), " ",
                     call(m.mine), ", rank ", m.peer, " ", call(m.theirs));
}

void CudaOrdered::watch() {
  // This thread's CUDA calls (event queries, the abort's writes) must not invalidate a graph that
  // another thread is capturing: torch captures in the global mode, which forbids them in every
  // thread that is not relaxed.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point next_liveness = Clock::now();
  for (;;) {
    // With nothing in flight, the watchdog sleeps until an op is queued, unless graphs may replay
    // captured ops: then it looks at the peers every 100 ms until the window is aborted.
    const bool replays = replays_ && aborted_.empty() && !closing_;
    if (pending_.empty()) {
      if (stopping_) return;
      if (!replays) {
        cv_.wait(lock);
        continue;
      }
    }
    // A peer's abort, or calls that disagree, first: an op that ended after it may have read a
    // slot the peer no longer filled, so nothing in flight then counts as done.
    std::string why = host_.abort_reason();
    if (!why.empty()) {
      fail_all(why);
      continue;
    }
    // The oldest op first: ops end in order on the one stream. An op that ended is done unless
    // the device rejected it (its end event comes after the admit that said so).
    cudaError_t st = cudaErrorNotReady;
    while (!pending_.empty() && (st = pending_.front()->end->status()) == cudaSuccess) {
      if (pending_.front()->end->rejected()) {
        why = disagreement();
        break;
      }
      finished_(pending_.front()->seq, "");
      pending_.pop_front();
    }
    // A rank whose extra turns of a disagreeing call wait for posts that never come.
    if (why.empty()) why = disagreement();
    if (pending_.empty()) cv_.notify_all();  // quiesce() waits for this
    if (why.empty() && !pending_.empty() && st != cudaErrorNotReady) {
      cudaGetLastError();
      why = detail::cat("the device failed: ", cudaGetErrorString(st));
    }
    if (why.empty() && (replays || !pending_.empty()) && Clock::now() >= next_liveness) {
      next_liveness = Clock::now() + std::chrono::milliseconds(100);
      for (int r = 0; r < window_->size() && why.empty(); ++r) {
        if (r == window_->rank()) continue;
        const std::string lost = host_.peer_lost(r);
        if (!lost.empty()) why = detail::cat("rank ", r, " is gone (", lost, ")");
      }
    }
    if (why.empty() && !pending_.empty() && Clock::now() >= pending_.front()->deadline) {
      why = detail::cat("did not end on the device within ", pending_.front()->timeout.count(),
                        " ms: a peer has not queued its part of it (or of an earlier stream-ordered op)");
    }
    if (!why.empty()) {
      const std::string where =
          pending_.empty() ? detail::cat("rank ", window_->rank(), ": ")
                           : detail::cat("rank ", pending_.front()->rank, ": ", pending_.front()->name, " #",
                                         pending_.front()->seq, ": ");
      host_.abort_group(where + why);
      fail_all(why);
      continue;
    }
    if (pending_.empty() && stopping_) return;
    cv_.wait_for(lock, pending_.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1));
  }
}

}  // namespace ringreduce

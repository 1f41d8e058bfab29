// ringreduce as a c10d::Backend: what torch.distributed calls when a group uses "ringreduce".
//
// Each call validates its tensors on the caller's thread (so bad input fails at the call, on this
// rank, without touching the group), assigns the op its sequence number and queues it for the
// group's progress thread, which runs the ring over the transport. The returned Work completes when
// the op has.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/config.h"
#include "backend/cuda_side.h"
#include "common/flight_recorder.h"
#include "backend/op_queue.h"
#include "backend/work.h"
#include "common/deadline.h"
#include "common/dtype.h"

namespace ringreduce {

class Collectives;
class Links;
class Messages;
class P2p;
struct Reduction;

// dst = a op b, element-wise, with ringreduce's kernels: the CPU ones, or the CUDA ones on the
// current stream. `op`: "sum", "product", "min", "max", "band", "bor", "bxor". For tests and the
// kernel benchmark.
void reduce_tensors(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                    const std::string& op);

class RingBackend final : public c10d::Backend {
 public:
  // Collective: every rank of the group constructs its backend at once (init_process_group /
  // new_group do). Sets up the transport through `store`.
  RingBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout);
  ~RingBackend() override;

  const std::string getBackendName() const override { return "ringreduce"; }

  // The direct op's all-reduce (direct_ops.cpp): allreduce() of one tensor, waited for, and run
  // here without a Work where the tensor and the queue allow (allreduce_inline).
  void allreduce_now(const at::Tensor& t, const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // Where torch sends sparse tensors (its dispatcher's SparseCPU key): the same as allreduce.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    return allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // ProcessGroup.monitored_barrier (torch's dist.monitored_barrier itself accepts gloo groups
  // only; this is what the process group's own method reaches). See monitored_barrier.h.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // The ring's halves as collectives of their own.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  // Point-to-point, with tags, on a channel of their own (p2p/p2p.h): they need no order with
  // the group's collectives or with each other beyond what their tags and peers say.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  // Coalesced forms: one Work for several tensors, run in order as one op.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;

  // Splitting: ProcessGroup.split_group (and dist.split_group where torch allows it) makes a
  // ringreduce group of the listed ranks from this one; ranks not listed get none.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
#if !defined(RINGREDUCE_TORCH_MINOR) || RINGREDUCE_TORCH_MINOR >= 208
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
#endif

  void setTimeout(std::chrono::milliseconds timeout) override;
  uint64_t getSequenceNumberForGroup() override;
  void setSequenceNumberForGroup() override {}  // starts at 0 on every rank already
  // Ends the op in flight (it fails with the reason) and every queued one; the group is unusable
  // afterwards.
  void abort() override;  // exit-ok: ends the group, not the process
  // Stops taking ops. Idle, it just stops the progress thread; with ops running or queued (called
  // from another thread, or with async ops not waited for) it ends them at once, and aborts the
  // group so that peers waiting for this rank fail too, instead of at their timeouts.
  void shutdown() override;

  const Config& config() const { return config_; }
  // The algorithm (ring, oneshot, twoshot) a call of `op` ("allreduce", "broadcast", ...) with
  // `bytes` per rank (the whole input for reduce_scatter) takes in this group.
  std::string algorithm(const std::string& op, int64_t bytes);
  // Forces an algorithm for this group from the next op on ("auto" restores the table); every
  // rank must call it at the same point of the group's op order, as it must issue the ops.
  void set_algorithm(const std::string& name);
  // The crossovers in force, as a line.
  std::string algorithms() const;
  // Segments this group created and still has linked in /dev/shm (empty once set up).
  std::vector<std::string> linked_segments() const;
  // How this group's shared-memory segments were made: "memfd", "/dev/shm" or "none".
  std::string segments() const;
  // Peers this rank reaches over TCP, and the "ip:port" it listens on for them ("" if none).
  std::vector<int> tcp_peers() const;
  std::string tcp_address() const;
  // How CUDA tensors travel in this group: "cuda_ipc", "staged", "" before its first CUDA op
  // (or in a build without CUDA).
  std::string cuda_transport() const;
  // Writes the flight recorder of this group on this rank to `dir` (RINGREDUCE_FLIGHT_DIR when
  // empty) and returns the file's path.
  std::string dump_flight_recorder(const std::string& dir, const std::string& reason);
  const std::string& flight_dir() const { return flight_dir_; }
  size_t flight_capacity() const { return flight_->capacity(); }
  const std::string& flight_group() const { return flight_->meta().group_uid; }

 public:
  // What an op does once its turn comes: validated and prepared at the call, run by the queue.
  // It is given the ring to run on: the host's, or the device's for CUDA tensors.
  using Body = RingBody;

 private:
  // The ops that more than one entry point builds. Each takes tensors that its callers have
  // checked (tensor_checks.h), with the dtype and reduction the checks returned, and checks
  // nothing again.
  Body allreduce_body(const at::Tensor& t, DType d, const Reduction& red);
  // The same for one dense contiguous CPU tensor of an async op, reduced in place in the storage
  // and at the offset it has at the call, with no tensor of its own: only under the op's storage
  // pins (enqueue's, for an async host op), which stop that memory from growing. No PREMUL_SUM.
  Body pinned_allreduce_body(const at::Tensor& t, DType d, const Reduction& red);
  // What an inference loop's and a plain dist.all_reduce's call is: one dense contiguous CPU
  // tensor reduced in place, waited for at once. When the group is idle it runs here, as a
  // synchronous op would through enqueue() (the same sequence number, flight record, deadline
  // and algorithm) but with no queued form of the op: no type-erased body, no Work until it has
  // ended. `t` is dense_cpu() and `red` no PREMUL_SUM (the callers check). Returns false, having
  // issued nothing, where a busy queue needs the queued path; `*issued_seq` (where given) is the op's number once it is issued. The op's
  // failure (a DistBackendError, once the flight recorder has it) is stored in `*error`, or
  // thrown where `error` is null.
  bool allreduce_inline(const at::Tensor& t, DType d, const Reduction& red,
                        std::chrono::milliseconds timeout, uint64_t* issued_seq = nullptr,
                        std::exception_ptr* error = nullptr);
#ifdef RINGREDUCE_WITH_CUDA
  c10::intrusive_ptr<c10d::Work> ordered_allreduce(const at::Tensor& t, DType d, const Reduction& red,
                                                   std::chrono::milliseconds timeout);
#endif
  Body reduce_scatter_body(const at::Tensor& output, const at::Tensor& input, DType d,
                           const Reduction& red);
  Body allgather_body(const at::Tensor& output, const at::Tensor& input);
  Body allgather_list_body(const std::vector<at::Tensor>& outputs, const at::Tensor& input);
  std::chrono::milliseconds current_timeout();  // setTimeout may change it from another thread
  // The first op of the group that fails dumps the flight recorder (a line on stderr says where),
  // as does a rank that finds the group aborted while it is in no op.
  void dump_on_failure(const std::string& reason);
  c10::intrusive_ptr<c10d::Work> p2p_recv(std::vector<at::Tensor>& tensors, int src, int tag,
                                          const char* op);

  // Runs op `seq` (its body `run`) where it is: the flight record of its start and end, the
  // group's abort checked first, its deadline from its start, a failure logged and dumped.
  // `began`: when the op started, its flight record of the start already made (an op that
  // starts where it is issued); {}: now, recorded here.
  void run_op(const char* name, uint64_t seq, std::chrono::milliseconds t, const std::string& traced,
              c10::function_ref<void(const OpContext&, const Deadline&)> run,
              Clock::time_point began = {});
  // Gives the op its sequence number and queues it; a synchronous op (async_op false) runs on the
  // calling thread instead when the queue is idle.
  // `outputs` and `inputs` are the caller's tensors, every one checked by the entry point, and
  // `device` what checked_device() found them on: it picks the ring.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name,
                                         std::optional<c10::Device> device,
                                         std::vector<at::Tensor> outputs,
                                         const std::vector<at::Tensor>& inputs,
                                         std::chrono::milliseconds timeout, bool async_op,
                                         Body body);

  Config config_;
  std::unique_ptr<Links> links_;
  std::unique_ptr<Messages> msgs_;
  std::unique_ptr<Collectives> algo_;  // over msgs_ and the transport's window
  std::unique_ptr<Links> p2p_links_;
  std::unique_ptr<P2p> p2p_;  // after its transport: stops before it goes away
#ifdef RINGREDUCE_WITH_CUDA
  std::unique_ptr<CudaSide> cuda_;  // after the host transport it may stage over
#endif
  std::atomic<uint64_t> next_p2p_seq_{0};  // a numbering of their own: ranks issue different ones
  std::mutex mu_;  // orders sequence numbers with queue order when several threads issue ops
  uint64_t next_seq_ = 0;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;  // set-up, and the monitored barrier
  std::string prefix_;                      // this group incarnation's keys on it
  uint64_t monitored_barriers_ = 0;         // each gets keys of its own
  bool idle_abort_logged_ = false;          // RINGREDUCE_DEBUG's line for it, once
  std::unique_ptr<FlightRecorder> flight_;
  std::string flight_dir_;
  OpQueue queue_;  // last member: its thread stops before the ring and transport go away
};

}  // namespace ringreduce

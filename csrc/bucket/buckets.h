// Gradient buckets for ringreduce.DistributedDataParallel.
//
// Gradients are reduced a bucket at a time: one flat buffer per bucket, with a view per parameter
// laid out as the parameter is, so one all-reduce moves many small gradients at once. Parameters
// are assigned in reverse order (backward produces the last layer's gradients first), per dtype
// and device, into a small first bucket (so that communication starts early) and then buckets of
// up to `bucket_bytes`. Bucket 0 is the first to fill in backward.
//
// Per iteration: prepare() resets the counts; each gradient hook calls mark_ready(), which copies
// the gradient into its view (scaled, so that the all-reduce's sum is the average) and returns the
// buckets that may start now. A bucket starts once all its gradients are in and every bucket
// before it has started, so every rank starts the same buckets in the same order. Once they have
// been reduced, write_back() hands the results to the parameters' .grad.
//
// Large gradients are not copied at all when the group averages as it reduces (see prepare()):
// a bucket is then reduced as a few segments, each parameter of at least kSoloBytes (and the
// parameter of a one-parameter bucket) in its own .grad, the runs of smaller ones between them in
// the flat buffer. Copying a large gradient in and the result back out would move its bytes twice
// more, as much memory traffic as the all-reduce itself, for no fewer messages: a segment of 1 MiB
// is already hundreds of microseconds of all-reduce against some tens for one more op.
//
// This class owns the bucket buffers; the parameters stay the caller's (the module's). It is
// driven from one thread at a time (autograd's hooks and its final callback run in order).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace ringreduce {

class Buckets {
 public:
  // Parameters that need no gradient must not be passed.
  Buckets(std::vector<at::Tensor> params, int64_t first_bucket_bytes, int64_t bucket_bytes);

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  const at::Tensor& buffer(int64_t b) const;
  // Parameter indices of bucket b, in the order their views lie in its buffer.
  const std::vector<int64_t>& params_of(int64_t b) const;
  std::vector<at::Tensor> views_of(int64_t b) const;
  int64_t bucket_of(int64_t p) const;
  const at::Tensor& view(int64_t p) const;
  // Replaces bucket b's buffer (a comm hook's set_buffer): same size and dtype; views follow.
  void set_buffer(int64_t b, const at::Tensor& t);

  // Parameters of at least this many bytes form a segment of their own (see above).
  static constexpr int64_t kSoloBytes = 1 << 20;

  // Starts an iteration. Gradients are multiplied by `scale` on their way in. Parameters listed
  // in `unused` will get no gradient: their views are zeroed and they count as ready at once.
  // With `solo_in_place` (the caller reduces with an averaging op), each bucket is reduced by
  // segments (reduce_targets()): a solo parameter's .grad, when it is a dense tensor like its
  // view, is reduced where it lies, unscaled, and write_back() leaves it be. Returns the buckets
  // that may start now (those holding only unused parameters).
  std::vector<int64_t> prepare(double scale, const std::vector<int64_t>& unused, bool solo_in_place);
  // Parameter p's gradient is final for this iteration. With `grad_as_view` the parameter's .grad
  // becomes its view of the bucket (and stays one); a one-parameter bucket whose gradient is not
  // its view (after zero_grad(set_to_none=True)) takes that gradient's memory as its buffer
  // rather than copying it in. Throws if p was already ready.
  std::vector<int64_t> mark_ready(int64_t p, bool grad_as_view);
  // Parameter p gets no gradient in this iteration: its view is zeroed and it counts as ready.
  std::vector<int64_t> mark_unused(int64_t p);
  int64_t num_ready() const { return ready_count_; }
  // What bucket b's all-reduces must reduce in this iteration, in order, each with whether it is
  // a solo segment (unscaled: the caller averages it in the reduction). Without `solo_in_place`:
  // the whole buffer, once. The same number and sizes of tensors on every rank, whatever their
  // gradients are like, so every rank issues the same all-reduces.
  std::vector<std::pair<at::Tensor, bool>> reduce_targets(int64_t b) const;
  // Parameter p's gradient is reduced in its .grad, not in the bucket, in this iteration.
  bool in_place(int64_t p) const;
  // Parameter p forms a segment of its own (see above).
  bool solo(int64_t p) const;
  // Parameters not ready yet in this iteration, in index order.
  std::vector<int64_t> pending_params() const;
  bool all_started() const { return next_start_ == num_buckets(); }
  bool in_iteration() const { return in_iteration_; }

  // Bucket b holds its reduced gradients: give them to its parameters. Parameters whose
  // `used[p]` is 0 (no rank produced a gradient for them) are left as they are; an empty `used`
  // means all were used. Called per bucket as each all-reduce completes, so that one bucket's
  // copy-out runs while later buckets are still being reduced.
  void write_back(int64_t b, const std::vector<uint8_t>& used, bool grad_as_view);
  // Ends the iteration (after every bucket's write_back).
  void end_iteration() { in_iteration_ = false; }

 private:
  struct Segment {
    size_t begin, end;  // positions in Bucket::params
    bool solo;
  };
  struct Bucket {
    at::Tensor buffer;
    std::vector<int64_t> params;
    std::vector<int64_t> offsets;  // element offset of each parameter's view in `buffer`
    std::vector<Segment> segments;
    int64_t pending = 0;
    bool complete = false;
  };
  void rebuild_views(int64_t b);
  void check_can_mark(int64_t p) const;
  std::vector<int64_t> start_ready_buckets();

  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> bucket_of_;
  std::vector<at::Tensor> views_;
  std::vector<uint8_t> ready_;
  int64_t ready_count_ = 0;
  int64_t next_start_ = 0;
  double scale_ = 1.0;
  bool solo_in_place_ = false;
  std::vector<uint8_t> solo_;      // per parameter: a segment of its own
  std::vector<uint8_t> in_place_;  // per parameter: reduced in its .grad in this iteration
  bool in_iteration_ = false;
};

}  // namespace ringreduce

#include "bucket/buckets.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <map>
#include <tuple>

#include "reduce/reduce.h"

namespace ringreduce {

namespace {
// Gradients at least this large go back from the buckets with streaming stores: larger than a
// server's L3 cache, they are read from memory by the optimizer's step either way, and the read
// for ownership of every written line would be wasted traffic. Smaller ones are written normally,
// so the step that follows finds them in cache (docs/ddp.md).
constexpr size_t kStreamBackBytes = 32u << 20;
}  // namespace

Buckets::Buckets(std::vector<at::Tensor> params, int64_t first_bucket_bytes, int64_t bucket_bytes)
    : params_(std::move(params)) {
  TORCH_CHECK(first_bucket_bytes > 0 && bucket_bytes > 0,
              "ringreduce DistributedDataParallel: bucket sizes must be positive, got ",
              first_bucket_bytes, " and ", bucket_bytes);
  const int64_t n = num_params();
  for (int64_t p = 0; p < n; ++p) {
    const at::Tensor& t = params_[p];
    TORCH_CHECK(t.defined() && t.layout() == at::kStrided,
                "ringreduce DistributedDataParallel: parameter ", p, " is not a dense tensor");
  }
  // Open buckets per (dtype, device), filled in reverse parameter order. A bucket closes when
  // the next parameter would take it past its limit: the first bucket of each kind is small.
  struct Open {
    std::vector<int64_t> params;
    int64_t bytes = 0;
    bool first = true;
  };
  std::map<std::tuple<int, int, int>, Open> open;
  std::vector<std::tuple<int, int, int>> order;  // kinds in the order first seen
  std::vector<std::vector<int64_t>> assigned;
  auto close = [&assigned](Open& o) {
    if (!o.params.empty()) assigned.push_back(std::move(o.params));
    o.params.clear();
    o.bytes = 0;
    o.first = false;
  };
  for (int64_t p = n - 1; p >= 0; --p) {
    const at::Tensor& t = params_[p];
    const auto key = std::make_tuple(static_cast<int>(t.scalar_type()),
                                     static_cast<int>(t.device().type()),
                                     static_cast<int>(t.device().index()));
    auto [it, fresh] = open.try_emplace(key);
    if (fresh) order.push_back(key);
    Open& o = it->second;
    const int64_t bytes = t.numel() * t.element_size();
    const int64_t limit = o.first ? first_bucket_bytes : bucket_bytes;
    if (!o.params.empty() && o.bytes + bytes > limit) close(o);
    o.params.push_back(p);
    o.bytes += bytes;
  }
  for (const auto& key : order) close(open[key]);

  bucket_of_.assign(n, -1);
  views_.resize(n);
  for (auto& ps : assigned) {
    Bucket b;
    int64_t elems = 0;
    for (int64_t p : ps) {
      b.offsets.push_back(elems);
      elems += params_[p].numel();
    }
    // Owned here; zeroed so that a parameter that never gets a gradient contributes nothing.
    b.buffer = at::zeros({elems}, params_[ps.front()].options().requires_grad(false));
    b.params = std::move(ps);
    for (size_t i = 0; i < b.params.size(); ++i) {
      const at::Tensor& t = params_[b.params[i]];
      const bool solo =
          b.params.size() == 1 || t.numel() * static_cast<int64_t>(t.element_size()) >= kSoloBytes;
      if (!solo && !b.segments.empty() && !b.segments.back().solo) {
        b.segments.back().end = i + 1;  // extends the run of small ones
      } else {
        b.segments.push_back(Segment{i, i + 1, solo});
      }
    }
    buckets_.push_back(std::move(b));
    const int64_t id = num_buckets() - 1;
    for (int64_t p : buckets_.back().params) bucket_of_[p] = id;
    rebuild_views(id);
  }
  ready_.assign(n, 0);
  in_place_.assign(n, 0);
  solo_.assign(n, 0);
  for (const Bucket& bk : buckets_) {
    for (const Segment& seg : bk.segments) {
      if (seg.solo) solo_[bk.params[seg.begin]] = 1;
    }
  }
}

void Buckets::rebuild_views(int64_t b) {
  Bucket& bk = buckets_[b];
  for (size_t i = 0; i < bk.params.size(); ++i) {
    const at::Tensor& p = params_[bk.params[i]];
    views_[bk.params[i]] = bk.buffer.narrow(0, bk.offsets[i], p.numel()).view(p.sizes());
  }
}

const at::Tensor& Buckets::buffer(int64_t b) const {
  TORCH_CHECK(b >= 0 && b < num_buckets(), "ringreduce DistributedDataParallel: no bucket ", b);
  return buckets_[b].buffer;
}

const std::vector<int64_t>& Buckets::params_of(int64_t b) const {
  TORCH_CHECK(b >= 0 && b < num_buckets(), "ringreduce DistributedDataParallel: no bucket ", b);
  return buckets_[b].params;
}

std::vector<at::Tensor> Buckets::views_of(int64_t b) const {
  std::vector<at::Tensor> out;
  for (int64_t p : params_of(b)) out.push_back(views_[p]);
  return out;
}

int64_t Buckets::bucket_of(int64_t p) const {
  TORCH_CHECK(p >= 0 && p < num_params(), "ringreduce DistributedDataParallel: no parameter ", p);
  return bucket_of_[p];
}

const at::Tensor& Buckets::view(int64_t p) const {
  TORCH_CHECK(p >= 0 && p < num_params(), "ringreduce DistributedDataParallel: no parameter ", p);
  return views_[p];
}

void Buckets::set_buffer(int64_t b, const at::Tensor& t) {
  const at::Tensor& old = buffer(b);
  TORCH_CHECK(t.defined() && t.dim() == 1 && t.numel() == old.numel() &&
                  t.scalar_type() == old.scalar_type() && t.device() == old.device() &&
                  t.is_contiguous(),
              "ringreduce DistributedDataParallel: set_buffer for bucket ", b, " needs a contiguous ",
              old.scalar_type(), " tensor of ", old.numel(), " elements on ", old.device());
  buckets_[b].buffer = t;
  rebuild_views(b);
}

std::vector<int64_t> Buckets::prepare(double scale, const std::vector<int64_t>& unused,
                                      bool solo_in_place) {
  scale_ = scale;
  solo_in_place_ = solo_in_place;
  in_iteration_ = true;
  ready_.assign(params_.size(), 0);
  in_place_.assign(params_.size(), 0);
  ready_count_ = 0;
  next_start_ = 0;
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.complete = false;
  }
  std::vector<int64_t> start;
  for (int64_t p : unused) {
    for (int64_t b : mark_unused(p)) start.push_back(b);
  }
  for (int64_t b : start_ready_buckets()) start.push_back(b);
  return start;
}

void Buckets::check_can_mark(int64_t p) const {
  TORCH_CHECK(in_iteration_, "ringreduce DistributedDataParallel: a gradient arrived outside of a "
              "synchronised backward (was forward run under no_grad or without the wrapper?)");
  TORCH_CHECK(p >= 0 && p < num_params(), "ringreduce DistributedDataParallel: no parameter ", p);
  TORCH_CHECK(!ready_[p], "ringreduce DistributedDataParallel: parameter ", p,
              " got its gradient twice in one iteration (a second backward through the same "
              "forward, or the parameter is used by two wrapped modules); call forward again "
              "before each backward, or use no_sync()");
}

std::vector<int64_t> Buckets::mark_unused(int64_t p) {
  check_can_mark(p);
  at::NoGradGuard no_grad;
  views_[p].zero_();
  ready_[p] = 1;
  ++ready_count_;
  Bucket& b = buckets_[bucket_of_[p]];
  if (--b.pending == 0) b.complete = true;
  return start_ready_buckets();
}

std::vector<int64_t> Buckets::mark_ready(int64_t p, bool grad_as_view) {
  check_can_mark(p);
  ready_[p] = 1;
  ++ready_count_;
  at::Tensor& param = params_[p];
  const at::Tensor& view = views_[p];
  at::NoGradGuard no_grad;
  const at::Tensor grad = param.grad();
  Bucket& b = buckets_[bucket_of_[p]];
  const bool solo_avg = solo_in_place_ && !grad_as_view && solo_[p];
  if (solo_avg && grad.defined() && grad.layout() == at::kStrided && grad.is_contiguous() &&
      grad.scalar_type() == view.scalar_type() && grad.device() == view.device() &&
      !grad.is_same(view)) {
    in_place_[p] = 1;  // reduced where it lies: no copy in, none out
    if (--b.pending == 0) b.complete = true;
    return start_ready_buckets();
  }
  // A solo segment is averaged in the reduction, so its gradient goes in unscaled.
  const double scale = solo_avg ? 1.0 : scale_;
  if (grad_as_view && b.params.size() == 1 && grad.defined() && !grad.is_same(view) &&
      grad.layout() == at::kStrided && grad.is_contiguous() && grad.sizes() == view.sizes() &&
      grad.scalar_type() == view.scalar_type() && grad.device() == view.device()) {
    // A one-parameter bucket adopts a gradient that is not its view (autograd hands over a new
    // tensor after zero_grad(set_to_none=True), torch's default): the gradient's memory becomes
    // the bucket's buffer, so .grad is the bucket's view again without copying it in (a weight
    // large enough to have a bucket of its own would otherwise be copied every step). The old
    // buffer is released with its last reference.
    set_buffer(bucket_of_[p], grad.view({-1}));
    if (scale != 1.0) view.mul_(scale);
  } else if (!grad.defined()) {
    view.zero_();
  } else if (grad.is_same(view)) {
    // Already the bucket's view (gradient_as_bucket_view): scale in place.
    if (scale != 1.0) view.mul_(scale);
  } else if (scale != 1.0) {
    // Copy and scale in one pass. The factor as a 0-dim tensor of the gradient's dtype: a bare
    // double would be a float64 operand and send the whole multiply through torch's much slower
    // type-promoting path.
    at::Tensor out = view;
    at::mul_out(out, grad, at::scalar_tensor(scale, grad.options()));
  } else {
    view.copy_(grad);
  }
  if (grad_as_view && !grad.is_same(view)) param.mutable_grad() = view;
  if (--b.pending == 0) b.complete = true;
  return start_ready_buckets();
}

std::vector<int64_t> Buckets::start_ready_buckets() {
  std::vector<int64_t> start;
  while (next_start_ < num_buckets() && buckets_[next_start_].complete) {
    start.push_back(next_start_++);
  }
  return start;
}

bool Buckets::in_place(int64_t p) const {
  TORCH_CHECK(p >= 0 && p < num_params(), "ringreduce DistributedDataParallel: no parameter ", p);
  return in_place_[p] != 0;
}

bool Buckets::solo(int64_t p) const {
  TORCH_CHECK(p >= 0 && p < num_params(), "ringreduce DistributedDataParallel: no parameter ", p);
  return solo_[p] != 0;
}

std::vector<std::pair<at::Tensor, bool>> Buckets::reduce_targets(int64_t b) const {
  (void)buffer(b);  // checks b
  const Bucket& bk = buckets_[b];
  if (!solo_in_place_) return {{bk.buffer, false}};
  std::vector<std::pair<at::Tensor, bool>> out;
  for (const Segment& seg : bk.segments) {
    if (seg.solo) {
      const int64_t p = bk.params[seg.begin];
      out.emplace_back(in_place_[p] ? params_[p].grad() : views_[p].view({-1}), true);
    } else {
      const int64_t from = bk.offsets[seg.begin];
      const int64_t to = bk.offsets[seg.end - 1] + params_[bk.params[seg.end - 1]].numel();
      out.emplace_back(bk.buffer.narrow(0, from, to - from), false);
    }
  }
  return out;
}

std::vector<int64_t> Buckets::pending_params() const {
  std::vector<int64_t> out;
  if (!in_iteration_) return out;
  for (int64_t p = 0; p < num_params(); ++p) {
    if (!ready_[p]) out.push_back(p);
  }
  return out;
}

void Buckets::write_back(int64_t b, const std::vector<uint8_t>& used, bool grad_as_view) {
  TORCH_CHECK(b >= 0 && b < num_buckets(), "ringreduce DistributedDataParallel: no bucket ", b);
  TORCH_CHECK(used.empty() || used.size() == params_.size(),
              "ringreduce DistributedDataParallel: write_back got ", used.size(), " flags for ",
              params_.size(), " parameters");
  const Bucket& bk = buckets_[b];
  at::NoGradGuard no_grad;
  for (int64_t p : bk.params) {
    if (in_place_[p]) continue;  // reduced where it lies
    if (!used.empty() && !used[p]) continue;
    at::Tensor& param = params_[p];
    const at::Tensor& view = views_[p];
    at::Tensor grad = param.grad();
    if (grad_as_view) {
      if (!grad.is_same(view)) param.mutable_grad() = view;
    } else if (grad.defined()) {
      const size_t bytes = static_cast<size_t>(view.numel()) * view.element_size();
      if (grad.device().is_cpu() && grad.is_contiguous() && grad.scalar_type() == view.scalar_type() &&
          bytes >= kStreamBackBytes) {
        copy(grad.data_ptr(), view.data_ptr(), bytes, /*streaming=*/true);
      } else {
        grad.copy_(view);
      }
    } else {
      // Reduced from other ranks' gradients only: a tensor of its own, not the bucket's memory,
      // which the next iteration overwrites.
      param.mutable_grad() = view.clone();
    }
  }
}

}  // namespace ringreduce

#include "backend/sparse.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "algo/collectives.h"
#include "common/error.h"

namespace ringreduce {

namespace {

[[noreturn]] void refuse(int rank, const std::string& what) {
  C10_THROW_ERROR(DistBackendError, detail::cat(op_prefix("allreduce", rank), what));
}

// Gathers every rank's `mine` (the same byte count everywhere) into `all`, rank after rank.
void gather_bytes(Collectives& algo, const at::Tensor& mine, const at::Tensor& all,
                  const OpContext& ctx, const Deadline& dl) {
  algo.all_gather(mine.data_ptr(), Chunks(all.data_ptr(), mine.nbytes()), mine.nbytes(),
                  DType::UInt8, ctx, dl);
}

}  // namespace

RingBody sparse_allreduce_body(const at::Tensor& t, const c10d::ReduceOp& op, int rank, int size) {
  if (t.layout() != at::kSparse) {
    refuse(rank, detail::cat(t.layout(), " tensors are not supported, only dense and sparse COO ones"));
  }
  if (op.op_ != c10d::ReduceOp::SUM) {
    refuse(rank, "sparse tensors are all-reduced with SUM only");
  }
  if (!t.device().is_cpu()) {
    refuse(rank, detail::cat("sparse tensors are all-reduced on the CPU only, got one on ", t.device()));
  }
  return [t, rank, size](Collectives& algo, const OpContext& ctx, const Deadline& dl) {
    at::NoGradGuard no_grad;
    const at::Tensor in = t.coalesce();
    const at::Tensor idx = in._indices().contiguous();  // [sparse_dim, nnz]
    const at::Tensor vals = in._values().contiguous();  // [nnz, dense sizes...]
    const int64_t nnz = in._nnz();
    // What every rank has: its count of non-zeros, then what must agree (dims, dtype, shape).
    std::vector<int64_t> meta{nnz, in.sparse_dim(), in.dense_dim(),
                              static_cast<int64_t>(t.scalar_type()), t.dim()};
    for (int64_t s : t.sizes()) meta.push_back(s);
    const at::Tensor my_meta = at::tensor(meta, at::kLong);
    const at::Tensor metas = at::empty({size, my_meta.numel()}, at::kLong);
    gather_bytes(algo, my_meta, metas, ctx, dl);
    int64_t max_nnz = 0;
    for (int r = 0; r < size; ++r) {
      const at::Tensor theirs = metas[r];
      if (!at::equal(theirs.narrow(0, 1, my_meta.numel() - 1), my_meta.narrow(0, 1, my_meta.numel() - 1))) {
        throw Error(detail::cat(op_prefix("allreduce", ctx.seq, rank), "rank ", r,
                                "'s sparse tensor differs from this rank's in shape, dimensions or "
                                "dtype (this rank: ", t.sizes(), " ", t.scalar_type(), ")"));
      }
      max_nnz = std::max(max_nnz, theirs[0].item<int64_t>());
    }
    // Indices and values, each padded to max_nnz entries so that every rank sends as many bytes.
    at::Tensor my_idx = at::zeros({idx.size(0), max_nnz}, idx.options());
    my_idx.narrow(1, 0, nnz).copy_(idx);
    std::vector<int64_t> val_shape = vals.sizes().vec();
    val_shape[0] = max_nnz;
    at::Tensor my_vals = at::zeros(val_shape, vals.options());
    my_vals.narrow(0, 0, nnz).copy_(vals);
    std::vector<int64_t> all_idx_shape{size, idx.size(0), max_nnz};
    std::vector<int64_t> all_val_shape{size};
    all_val_shape.insert(all_val_shape.end(), val_shape.begin(), val_shape.end());
    const at::Tensor all_idx = at::empty(all_idx_shape, idx.options());
    const at::Tensor all_vals = at::empty(all_val_shape, vals.options());
    gather_bytes(algo, my_idx, all_idx, ctx, dl);
    gather_bytes(algo, my_vals, all_vals, ctx, dl);
    // Rank order, then coalesce: the same sum, bit for bit, on every rank.
    std::vector<at::Tensor> idx_parts, val_parts;
    for (int r = 0; r < size; ++r) {
      const int64_t n = metas[r][0].item<int64_t>();
      idx_parts.push_back(all_idx[r].narrow(1, 0, n));
      val_parts.push_back(all_vals[r].narrow(0, 0, n));
    }
    const at::Tensor sum =
        at::sparse_coo_tensor(at::cat(idx_parts, 1), at::cat(val_parts, 0), t.sizes(), t.options())
            .coalesce();
    t.copy_(sum);
  };
}

}  // namespace ringreduce

#include "algo/hierarchical.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "common/failpoint.h"
#include "algo/slicing.h"

namespace ringreduce {

namespace {

std::vector<int> host_members(const HostLayout& hosts, int rank) {
  return hosts.ranks_on(hosts.host_of(rank));
}

// Rank `rank`'s counterparts: the ranks at its place (its index among its host's ranks) on every
// host, in host order.
std::vector<int> cross_members(const HostLayout& hosts, int rank) {
  const std::vector<int> mine = host_members(hosts, rank);
  const auto place = std::find(mine.begin(), mine.end(), rank) - mine.begin();
  std::vector<int> out;
  for (int h = 0; h < hosts.hosts(); ++h) out.push_back(hosts.ranks_on(h)[static_cast<size_t>(place)]);
  return out;
}

}  // namespace

Hierarchical::Hierarchical(Transport& t, const HostLayout& hosts, size_t slice_bytes,
                           bool check_fingerprints)
    : host_t_(t, host_members(hosts, t.rank())),
      cross_t_(t, cross_members(hosts, t.rank())),
      host_msgs_(host_t_, slice_bytes),
      cross_msgs_(cross_t_, slice_bytes),
      host_(host_msgs_),
      cross_(cross_msgs_) {
  RR_CHECK(hosts.hosts() > 1 && hosts.per_host() > 1, "ringreduce: rank ", t.rank(),
           ": a hierarchical all-reduce needs several hosts with as many ranks on each, not ",
           hosts.describe());
  host_msgs_.set_check_fingerprints(check_fingerprints);
  cross_msgs_.set_check_fingerprints(check_fingerprints);
}

void Hierarchical::allreduce(const void* in, void* out, size_t count, DType t, RedOp op,
                             int64_t divisor, const MsgHeader& fp, const OpContext& ctx,
                             const Deadline& dl) {
  // This rank's chunk, as the host ring's reduce-scatter cuts `count`.
  const size_t per = static_cast<size_t>(host_msgs_.size());
  const size_t chunk = slicing::ceil_div(count, per);
  const size_t begin = std::min(count, static_cast<size_t>(host_msgs_.rank()) * chunk);
  const size_t len = std::min(count - begin, chunk);
  auto* mine = static_cast<uint8_t*>(out) + begin * dtype_size(t);
  const int rank = host_t_.group_rank(host_msgs_.rank());
  failpoint("hierarchical.host_reduce_scatter", rank);
  host_.reduce_scatter_part(in, out, count, t, op, 1, fp, ctx, dl);
  failpoint("hierarchical.cross_allreduce", rank);
  cross_.allreduce(mine, mine, len, t, op, divisor, fp, ctx, dl);
  failpoint("hierarchical.host_all_gather", rank);
  host_.all_gather_part(out, count, t, fp, ctx, dl);
}

}  // namespace ringreduce

#include "transport/sub_transport.h"

#include <algorithm>

#include "common/error.h"

namespace ringreduce {

SubTransport::SubTransport(Transport& t, std::vector<int> members) : t_(t), members_(std::move(members)) {
  std::vector<int> sorted = members_;
  std::sort(sorted.begin(), sorted.end());
  RR_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() &&
               (sorted.empty() || (sorted.front() >= 0 && sorted.back() < t.size())),
           "ringreduce: rank ", t.rank(), ": a view of the group names a rank twice or out of range");
  for (size_t i = 0; i < members_.size(); ++i) {
    if (members_[i] == t.rank()) rank_ = static_cast<int>(i);
  }
  RR_CHECK(rank_ >= 0, "ringreduce: rank ", t.rank(), " is not in its own view of the group");
}

int SubTransport::group_rank(int member) const {
  return member >= 0 && member < size() ? members_[static_cast<size_t>(member)] : member;
}

int SubTransport::at(int peer) const {
  RR_CHECK(peer >= 0 && peer < size() && peer != rank_, "ringreduce: rank ", t_.rank(),
           " names invalid member ", peer, " of a view of ", size(), " ranks");
  return members_[static_cast<size_t>(peer)];
}

}  // namespace ringreduce

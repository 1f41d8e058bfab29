// Which host each rank of a group is on, as the link probe found it (transport/links.h): ranks
// that reach each other through shared memory share a host. What the hierarchical all-reduce
// (algo/hierarchical.h) is built from, and what the algorithm layer chooses by.
#pragma once

#include <string>
#include <vector>

#include "transport/transport.h"

namespace ringreduce {

class HostLayout {
 public:
  HostLayout() = default;  // one host, or a layout that could not be agreed: no hierarchy
  // host_of[r]: the host of rank r, hosts numbered 0.. in the order of their lowest rank.
  explicit HostLayout(std::vector<int> host_of);

  // Collective over the group: every rank publishes which of its peers it reaches through shared
  // memory (local[p]), rank 0 checks that these views agree (every rank of a host sees the same
  // set) and publishes the layout, which every rank adopts. Views that do not agree (a probe that
  // found a pair one way only) give the empty layout, the same on every rank.
  static HostLayout agree(Bootstrap& bs, const std::string& prefix, int rank, int size,
                          const std::vector<uint8_t>& local);

  // RINGREDUCE_FAKE_HOSTS=h: `size` ranks cut into h blocks of consecutive ranks (as torchrun
  // numbers the ranks of its nodes), for running the multi-host algorithms on one machine. Throws
  // unless 1 <= h <= size.
  static HostLayout split(int size, int hosts);

  int hosts() const { return hosts_; }
  // Ranks on every host when each has as many, else 0.
  int per_host() const { return per_host_; }
  int host_of(int rank) const { return host_of_.empty() ? 0 : host_of_[static_cast<size_t>(rank)]; }
  // The ranks on `host`, in rank order.
  std::vector<int> ranks_on(int host) const;
  // "2 hosts x 2 ranks", "3 hosts of 2, 2 and 1 ranks", "one host".
  std::string describe() const;

 private:
  std::vector<int> host_of_;
  int hosts_ = 1;
  int per_host_ = 0;
};

}  // namespace ringreduce

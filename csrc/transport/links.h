// The transports of one group, chosen per peer by a probe through the store (transport/registry.h):
// shared memory with the peers whose segments this rank can open (and that can open its own), TCP
// with the others. The ring and the point-to-point engine see one Transport either way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/hosts.h"
#include "transport/registry.h"
#include "transport/routed.h"

namespace ringreduce {

class Links {
 public:
  // Collective over the group. With `routes` given (those another Links of the same group found),
  // no probe is run: each peer is reached by the row that carries it there.
  Links(Bootstrap& bs, const std::string& prefix, int rank, int size, const LinkOptions& opts,
        const std::vector<int8_t>* routes = nullptr);
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  Transport& transport() { return routed_ ? static_cast<Transport&>(*routed_) : *rows_[0]; }
  // routes()[p]: the row of transport_kinds() that carries peer p (-1 for this rank).
  const std::vector<int8_t>& routes() const { return routes_; }
  // The transport of the row named `name`, or null where this rank made none.
  Transport* row(const char* name) const;
  // The peers the row named `name` carries, in rank order.
  std::vector<int> peers_over(const char* name) const;
  // "shm", "tcp", ...: the one row that carries every peer, or "mixed"; the first row's name in
  // a group of one.
  std::string carried_by() const;
  // "peers over shm: 1,2 (segments: memfd); over tcp: none": each row, its peers and its set-up.
  std::string describe() const;
  // Which host each rank is on (HostLayout::agree over the routes, or the given hosts); one host
  // for links built from another's routes.
  const HostLayout& hosts() const { return hosts_; }

 private:
  int rank_;
  std::vector<int8_t> routes_;
  HostLayout hosts_;
  // Index as transport_kinds(). A later row reports to the first (its I/O thread may call into
  // it until it is gone), so the rows go last to first, a failed constructor's included.
  struct Rows : std::vector<std::unique_ptr<Transport>> {
    Rows() = default;
    Rows(const Rows&) = delete;
    Rows& operator=(const Rows&) = delete;
    ~Rows() {
      for (size_t i = size(); i-- > 0;) (*this)[i].reset();
    }
  };
  Rows rows_;
  std::unique_ptr<RoutedTransport> routed_;  // after rows_: it goes first
};

}  // namespace ringreduce

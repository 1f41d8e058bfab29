#include "transport/links.h"

#include "common/error.h"

namespace ringreduce {

Links::Links(Bootstrap& bs, const std::string& prefix, int rank, int size, const LinkOptions& opts,
             const std::vector<int8_t>* routes)
    : rank_(rank) {
  const auto& kinds = transport_kinds();
  const bool automatic = opts.mode == "auto" || opts.mode.empty();
  const int forced = automatic ? -1 : transport_row(opts.mode);
  RR_CHECK(automatic || forced >= 0, "ringreduce: no transport named '", opts.mode, "'");
  if (routes != nullptr) {
    RR_CHECK(routes->size() == static_cast<size_t>(size), "ringreduce: ", routes->size(),
             " routes for a group of ", size);
  }
  const bool fake_hosts = routes == nullptr && forced < 0 && opts.given_hosts.hosts() > 1;
  routes_.assign(size, -1);
  std::vector<uint8_t> left(size, 1);
  left[rank] = 0;
  rows_.resize(kinds.size());
  for (size_t i = 0; i < kinds.size(); ++i) {
    const TransportKind& kind = kinds[i];
    std::vector<uint8_t> want(size, 0);
    bool probe = false;
    bool any = false;
    for (int p = 0; p < size; ++p) {
      if (!left[p]) continue;
      if (routes != nullptr) {
        want[p] = (*routes)[p] == static_cast<int8_t>(i);
      } else if (forced >= 0) {
        want[p] = forced == static_cast<int>(i);
      } else if (fake_hosts) {
        want[p] = !kind.same_host ||
                  opts.given_hosts.host_of(p) == opts.given_hosts.host_of(rank);
      } else {
        want[p] = 1;
        probe = true;
      }
      any = any || want[p];
    }
    if (i > 0 && !any) continue;  // the first row is made by every rank: it is the control
    std::vector<uint8_t> reached(size, 0);
    const LinkSetup setup{bs, prefix, rank, size, opts, rows_[0] ? &rows_[0]->control() : nullptr};
    rows_[i] = kind.make(setup, want, probe, reached);
    for (int p = 0; p < size; ++p) {
      if (!want[p] || !reached[p]) continue;
      routes_[p] = static_cast<int8_t>(i);
      left[p] = 0;
    }
  }
  for (int p = 0; p < size; ++p) {
    RR_CHECK(!left[p], "ringreduce: rank ", rank, " has no transport to rank ", p,
             " (RINGREDUCE_TRANSPORT=", opts.mode, ")");
  }
  bool one_row = true;
  for (int p = 0; p < size; ++p) one_row = one_row && (p == rank || routes_[p] == 0);
  if (one_row) return;  // every peer through the control: it alone is the ring's transport
  if (routes == nullptr) {
    std::vector<uint8_t> local(size, 0);
    for (int p = 0; p < size; ++p) local[p] = p != rank && kinds[routes_[p]].same_host;
    hosts_ = fake_hosts ? opts.given_hosts : HostLayout::agree(bs, prefix, rank, size, local);
  }
  std::vector<Transport*> rows;
  for (auto& t : rows_) rows.push_back(t.get());
  routed_ = std::make_unique<RoutedTransport>(rank, size, std::move(rows), routes_);
}

Transport* Links::row(const char* name) const {
  const int i = transport_row(name);
  return i < 0 ? nullptr : rows_[static_cast<size_t>(i)].get();
}

std::vector<int> Links::peers_over(const char* name) const {
  const int i = transport_row(name);
  std::vector<int> out;
  for (int p = 0; p < static_cast<int>(routes_.size()); ++p) {
    if (p != rank_ && routes_[p] == i) out.push_back(p);
  }
  return out;
}

std::string Links::carried_by() const {
  int only = -2;
  for (int p = 0; p < static_cast<int>(routes_.size()); ++p) {
    if (p == rank_) continue;
    if (only == -2) only = routes_[p];
    if (routes_[p] != only) return "mixed";
  }
  return transport_kinds()[only < 0 ? 0 : static_cast<size_t>(only)].name;
}

std::string Links::describe() const {
  const auto& kinds = transport_kinds();
  std::string out = "peers over ";
  for (size_t i = 0; i < kinds.size(); ++i) {
    std::string list;
    for (int p : peers_over(kinds[i].name)) list += detail::cat(list.empty() ? "" : ",", p);
    out += detail::cat(i == 0 ? "" : "; over ", kinds[i].name, ": ", list.empty() ? "none" : list);
    if (!list.empty()) out += detail::cat(" (", kinds[i].note(*rows_[i]), ")");
  }
  return out;
}

}  // namespace ringreduce

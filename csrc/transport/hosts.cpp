#include "transport/hosts.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"

namespace ringreduce {

HostLayout::HostLayout(std::vector<int> host_of) : host_of_(std::move(host_of)) {
  if (host_of_.empty()) return;
  hosts_ = *std::max_element(host_of_.begin(), host_of_.end()) + 1;
  std::vector<int> count(static_cast<size_t>(hosts_), 0);
  for (int h : host_of_) {
    RR_CHECK(h >= 0, "ringreduce: a host layout names host ", h);
    ++count[static_cast<size_t>(h)];
  }
  per_host_ = count[0];
  for (int c : count) {
    RR_CHECK(c > 0, "ringreduce: a host layout leaves a host without ranks");
    if (c != per_host_) per_host_ = 0;
  }
}

HostLayout HostLayout::split(int size, int hosts) {
  RR_CHECK(hosts >= 1 && hosts <= size, "ringreduce: RINGREDUCE_FAKE_HOSTS=", hosts,
           " must be between 1 and the group's size (", size, ")");
  std::vector<int> host_of(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    host_of[static_cast<size_t>(r)] = static_cast<int>(static_cast<int64_t>(r) * hosts / size);
  }
  return HostLayout(std::move(host_of));
}

std::vector<int> HostLayout::ranks_on(int host) const {
  std::vector<int> out;
  for (size_t r = 0; r < host_of_.size(); ++r) {
    if (host_of_[r] == host) out.push_back(static_cast<int>(r));
  }
  return out;
}

std::string HostLayout::describe() const {
  if (hosts_ <= 1) return "one host";
  if (per_host_ > 0) return detail::cat(hosts_, " hosts x ", per_host_, " rank", per_host_ > 1 ? "s" : "");
  std::ostringstream s;
  s << hosts_ << " hosts of ";
  for (int h = 0; h < hosts_; ++h) {
    s << (h == 0 ? "" : h + 1 == hosts_ ? " and " : ", ") << ranks_on(h).size();
  }
  s << " ranks";
  return s.str();
}

HostLayout HostLayout::agree(Bootstrap& bs, const std::string& prefix, int rank, int size,
                             const std::vector<uint8_t>& local) {
  // Each rank names the lowest rank of its host (as it sees it) and how many ranks that host has.
  int lowest = rank, count = 1;
  for (int p = 0; p < size; ++p) {
    if (p == rank || !local[static_cast<size_t>(p)]) continue;
    lowest = std::min(lowest, p);
    ++count;
  }
  const std::string key = prefix + "hosts";
  bs.set(detail::cat(key, "/", rank), detail::cat(lowest, " ", count));
  std::string text;
  if (rank == 0) {
    std::vector<int> low(static_cast<size_t>(size)), cnt(static_cast<size_t>(size));
    bool agreed = true;
    for (int r = 0; r < size; ++r) {
      std::istringstream in(r == 0 ? detail::cat(lowest, " ", count) : bs.get(detail::cat(key, "/", r)));
      in >> low[static_cast<size_t>(r)] >> cnt[static_cast<size_t>(r)];
      agreed = agreed && !in.fail();
    }
    // Views agree when each rank's lowest rank names itself, and each host's ranks count as many
    // ranks as each of them sees.
    std::vector<int> members(static_cast<size_t>(size), 0), host_of(static_cast<size_t>(size), -1);
    int hosts = 0;
    for (int r = 0; agreed && r < size; ++r) {
      const int l = low[static_cast<size_t>(r)];
      agreed = l >= 0 && l <= r && low[static_cast<size_t>(l)] == l;
      if (!agreed) break;
      ++members[static_cast<size_t>(l)];
      host_of[static_cast<size_t>(r)] = l == r ? hosts++ : host_of[static_cast<size_t>(l)];
    }
    for (int r = 0; agreed && r < size; ++r) {
      agreed = cnt[static_cast<size_t>(r)] == members[static_cast<size_t>(low[static_cast<size_t>(r)])];
    }
    std::ostringstream out;
    for (int r = 0; agreed && r < size; ++r) out << (r ? " " : "") << host_of[static_cast<size_t>(r)];
    text = agreed ? out.str() : std::string("-");
    bs.set(key, text);
  } else {
    text = bs.get(key);
  }
  if (text == "-") return HostLayout();
  std::vector<int> host_of;
  std::istringstream in(text);
  for (int h; in >> h;) host_of.push_back(h);
  RR_CHECK(host_of.size() == static_cast<size_t>(size), "ringreduce: rank ", rank,
           " read a malformed host layout from the store: '", text, "'");
  return HostLayout(std::move(host_of));
}

}  // namespace ringreduce

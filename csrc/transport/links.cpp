#include "transport/links.h"

#include "common/error.h"

namespace ringreduce {

TransportMode parse_transport_mode(const std::string& text) {
  if (text == "auto" || text.empty()) return TransportMode::Auto;
  if (text == "shm") return TransportMode::Shm;
  if (text == "tcp") return TransportMode::Tcp;
  throw Error(detail::cat("ringreduce: RINGREDUCE_TRANSPORT=", text, " is not one of auto, shm, tcp"));
}

const char* transport_mode_name(TransportMode m) {
  switch (m) {
    case TransportMode::Auto: return "auto";
    case TransportMode::Shm: return "shm";
    case TransportMode::Tcp: return "tcp";
  }
  return "?";
}

Links::Links(Bootstrap& bs, const std::string& prefix, int rank, int size, const LinkOptions& opts,
             const std::vector<uint8_t>* local)
    : rank_(rank) {
  local_.assign(size, 0);
  if (local != nullptr) {
    RR_CHECK(local->size() == static_cast<size_t>(size), "ringreduce: ", local->size(),
             " routes for a group of ", size);
    local_ = *local;
    local_[rank] = 0;
    shm_ = std::make_unique<ShmTransport>(bs, prefix, rank, size, opts.shm,
                                          ShmTransport::Reach::Require, local_);
  } else if (opts.mode == TransportMode::Shm) {
    shm_ = std::make_unique<ShmTransport>(bs, prefix, rank, size, opts.shm);
    for (int p = 0; p < size; ++p) local_[p] = p != rank;
  } else if (opts.mode == TransportMode::Auto && opts.given_hosts.hosts() > 1) {
    for (int p = 0; p < size; ++p) {
      local_[p] = p != rank && opts.given_hosts.host_of(p) == opts.given_hosts.host_of(rank);
    }
    shm_ = std::make_unique<ShmTransport>(bs, prefix, rank, size, opts.shm,
                                          ShmTransport::Reach::Require, local_);
  } else if (opts.mode == TransportMode::Auto) {
    shm_ = std::make_unique<ShmTransport>(bs, prefix, rank, size, opts.shm,
                                          ShmTransport::Reach::Probe);
    for (int p = 0; p < size; ++p) local_[p] = shm_->is_local(p);
  } else {
    // RINGREDUCE_TRANSPORT=tcp: shared memory only as this rank's own segment (its abort flag).
    shm_ = std::make_unique<ShmTransport>(bs, prefix, rank, size, opts.shm,
                                          ShmTransport::Reach::Require, local_);
  }
  std::vector<uint8_t> remote(size, 0);
  bool any = false;
  for (int p = 0; p < size; ++p) {
    remote[p] = p != rank && !local_[p];
    any = any || remote[p];
  }
  if (!any) return;  // every peer on this host: shared memory alone, as the ring's only transport
  if (local == nullptr) {
    hosts_ = opts.mode == TransportMode::Auto && opts.given_hosts.hosts() > 1
                 ? opts.given_hosts
                 : HostLayout::agree(bs, prefix, rank, size, local_);
  }
  TcpConfig tc = opts.tcp;
  if (opts.listen_address) tc.listen_address = opts.listen_address();
  tcp_ = std::make_unique<TcpTransport>(bs, prefix, rank, size, tc, remote,
                                        RoutedTransport::hooks_beside(shm_.get()));
  routed_ = std::make_unique<RoutedTransport>(rank, size, shm_.get(), tcp_.get(), remote);
}

std::vector<int> Links::tcp_peers() const {
  std::vector<int> out;
  for (int p = 0; p < static_cast<int>(local_.size()); ++p) {
    if (tcp_ && p != rank_ && !local_[p]) out.push_back(p);
  }
  return out;
}

std::vector<std::string> Links::linked_segments() const {
  return shm_ ? shm_->linked_segments() : std::vector<std::string>{};
}

}  // namespace ringreduce

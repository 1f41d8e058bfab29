// The transports of one group, chosen per peer by a probe through the store: shared memory with
// the peers whose segments this rank can open (and that can open its own), TCP with the others.
// The ring and the point-to-point engine see one Transport either way.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/hosts.h"
#include "transport/routed.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/address.h"  // choose_listen_address, for LinkOptions::listen_address
#include "transport/tcp/tcp_transport.h"

namespace ringreduce {

enum class TransportMode { Auto, Shm, Tcp };
// "auto", "shm", "tcp" (RINGREDUCE_TRANSPORT); throws naming the variable otherwise.
TransportMode parse_transport_mode(const std::string& text);
const char* transport_mode_name(TransportMode m);

struct LinkOptions {
  TransportMode mode = TransportMode::Auto;
  ShmConfig shm;
  TcpConfig tcp;  // its listen_address is filled from listen_address() when TCP is needed
  std::function<std::string()> listen_address;
  // Hosts given instead of probed (RINGREDUCE_FAKE_HOSTS, with mode Auto): peers on this rank's
  // host are reached through shared memory, the others over TCP, as if on other machines.
  HostLayout given_hosts;
};

class Links {
 public:
  // Collective over the group. With `local` given (the routes another Links of the same group
  // found), no probe is run: peers with local[p] use shared memory, the others TCP.
  Links(Bootstrap& bs, const std::string& prefix, int rank, int size, const LinkOptions& opts,
        const std::vector<uint8_t>* local = nullptr);

  Transport& transport() { return routed_ ? static_cast<Transport&>(*routed_) : *shm_; }
  // local()[p]: p is reached through shared memory.
  const std::vector<uint8_t>& local() const { return local_; }
  // How the shared-memory segments were made: "memfd" (no name), "/dev/shm" (named, unlinked
  // once mapped), or "none" (no shared memory).
  const char* segments() const {
    return shm_ == nullptr ? "none" : shm_->anonymous() ? "memfd" : "/dev/shm";
  }
  std::vector<int> tcp_peers() const;
  std::vector<std::string> linked_segments() const;
  // "ip:port" this rank listens on for TCP peers, "" without any.
  std::string tcp_address() const { return tcp_ ? tcp_->address() : std::string(); }
  const TcpTransport* tcp() const { return tcp_.get(); }
  // Which host each rank is on (HostLayout::agree over the routes, or the given hosts); one host
  // for links built from another's routes.
  const HostLayout& hosts() const { return hosts_; }

 private:
  int rank_;
  std::vector<uint8_t> local_;
  HostLayout hosts_;
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<TcpTransport> tcp_;  // after shm_: its hooks point at it
  std::unique_ptr<RoutedTransport> routed_;
};

}  // namespace ringreduce

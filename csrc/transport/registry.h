// The transports a group reaches its peers by, in order of preference: each peer is carried by the
// first one that reaches it, as NCCL probes its transports in order. Adding a transport is its
// folder under transport/, its options in LinkOptions and one row in transport_kinds().
//
// The first row, shared memory, is also the group's control: every rank makes it, whatever else
// it uses, for its segment's abort flag, doorbell and the rank's state that peers following a
// chain of waits read. A later row reports to it (its aborts, doorbell rings and this rank's
// state go to the control too), so that one abort flag and one doorbell cover the whole group.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/hosts.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"

namespace ringreduce {

// RINGREDUCE_TRANSPORT: "auto" (each peer by the first row that reaches it), or a row's name,
// which must then carry every peer.
using TransportMode = std::string;
// Throws naming the variable and the names it takes when `text` is neither "auto" (or empty, which
// means auto) nor a row's name.
TransportMode parse_transport_mode(const std::string& text);

struct LinkOptions {
  TransportMode mode = "auto";
  ShmConfig shm;
  TcpConfig tcp;  // its listen_address is filled from listen_address() when TCP is needed
  std::function<std::string()> listen_address;
  // Hosts given instead of probed (RINGREDUCE_FAKE_HOSTS, with mode auto): peers on this rank's
  // host are reached through the rows that reach only their own host, the others by the rest, as
  // if on other machines.
  HostLayout given_hosts;
};

// What a row's factory is given: the group, its options, and the group's control (the first
// row's; null while that row is being made).
struct LinkSetup {
  Bootstrap& bs;
  const std::string& prefix;
  int rank;
  int size;
  const LinkOptions& opts;
  GroupControl* control;
};

struct TransportKind {
  const char* name;  // as RINGREDUCE_TRANSPORT and the INFO line call it
  bool same_host;    // reaches only peers on this rank's host: what hosts are agreed from
  // Collective over the ranks that make this row (the first row: every rank; a later one: every
  // rank with a peer left to it, which is every peer of those peers). want[p]: peer p is left to
  // this row or a later one. probe: the peers it cannot reach stay left to the later rows;
  // otherwise it must reach every wanted peer, and throws naming one it cannot. Sets reached[p]
  // for the wanted peers it carries. Returns null where it carries none, but for the first row.
  std::unique_ptr<Transport> (*make)(const LinkSetup& setup, const std::vector<uint8_t>& want,
                                     bool probe, std::vector<uint8_t>& reached);
  // How the transport it made is set up, for the INFO line ("segments: memfd").
  std::string (*note)(const Transport& made);
};

// The rows, in order of preference.
const std::vector<TransportKind>& transport_kinds();
// The row named `name`, or -1.
int transport_row(const std::string& name);

}  // namespace ringreduce

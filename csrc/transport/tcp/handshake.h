// The set-up of one connection: what both ends say and check before a frame crosses it.
//
// The higher rank of a pair connects (connect_and_greet) and sends its Hello first; the lower
// rank's I/O thread accepts, checks it within kHelloTimeout and answers with its own
// (TcpTransport::service_pending). A Hello carries the job's secret, drawn by rank 0 and shared
// through the store, which every rank already trusts (see wire.h).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "transport/tcp/wire.h"
#include "transport/transport.h"

namespace ringreduce {
namespace tcp {

// An accepted connection must deliver its whole Hello within this time.
constexpr std::chrono::milliseconds kHelloTimeout{5000};

// What this rank says in its Hellos and expects of its peers'.
class Handshake {
 public:
  Handshake() = default;
  // Collective over the group: rank 0 draws the job's secret and publishes it under `prefix`, the
  // others read it.
  Handshake(Bootstrap& bs, const std::string& prefix, int rank, int size, uint32_t sockets,
            uint64_t slot_bytes);
  // This rank's Hello for socket `socket` of a pair.
  Hello ours(uint32_t socket) const;
  // Why `n` bytes are not a Hello of this group, "" when they are (*theirs holds it then).
  std::string check(const uint8_t* bytes, size_t n, Hello* theirs) const;

 private:
  HelloExpect expect_;
  Hello hello_;  // socket set per connection
};

// Connects `rank` to rank `peer` at `where` ("ip:port"), retrying refusals until `dl`, says hello
// as socket `socket` of the pair and checks that `peer` answers for that socket. Returns the
// connected, non-blocking descriptor; throws naming both ranks and the address. `timeout` is what
// `dl` was made from, for the message.
int connect_and_greet(const Handshake& hs, int rank, int peer, uint32_t socket,
                      const std::string& where, const Deadline& dl, std::chrono::milliseconds timeout);

// Sets TCP_NODELAY (best effort: it only costs latency where it fails).
void set_nodelay(int fd);

}  // namespace tcp
}  // namespace ringreduce

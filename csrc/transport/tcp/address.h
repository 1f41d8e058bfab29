// Which IPv4 address a rank listens on and publishes, and "ip:port" as text both ways.
#pragma once

#include <netinet/in.h>

#include <string>

namespace ringreduce {

// The IPv4 address to listen on: that of interface `ifname` when given (RINGREDUCE_SOCKET_IFNAME),
// else the local address the kernel would use to reach `peer_host` (the store's host), else that
// of this host's name; "127.0.0.1" when nothing else is found. Throws if `ifname` has no IPv4
// address, listing the interfaces that have one.
std::string choose_listen_address(const std::string& ifname, const std::string& peer_host);

namespace tcp {
// "ip:port" of an IPv4 socket address.
std::string sockaddr_text(const sockaddr_in& a);
// Parses "ip:port" (as sockaddr_text writes it); false when it is not one.
bool parse_address(const std::string& text, sockaddr_in* out);
}  // namespace tcp

}  // namespace ringreduce

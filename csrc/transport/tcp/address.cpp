#include "transport/tcp/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace ringreduce {

namespace tcp {

std::string sockaddr_text(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return detail::cat(ip, ":", ntohs(a.sin_port));
}

bool parse_address(const std::string& text, sockaddr_in* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  const long port = std::strtol(text.c_str() + colon + 1, nullptr, 10);
  if (port <= 0 || port > 65535) return false;
  out->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, text.substr(0, colon).c_str(), &out->sin_addr) == 1;
}

}  // namespace tcp

std::string choose_listen_address(const std::string& ifname, const std::string& peer_host) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    RR_SYSCHECK(getifaddrs(&list) == 0, "ringreduce tcp: cannot list network interfaces");
    std::string found, have;
    for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, ip, sizeof ip);
      have += detail::cat(have.empty() ? "" : ", ", i->ifa_name, " ", ip);
      if (found.empty() && ifname == i->ifa_name) found = ip;
    }
    freeifaddrs(list);
    RR_CHECK(!found.empty(), "ringreduce tcp: RINGREDUCE_SOCKET_IFNAME=", ifname,
             " names no interface with an IPv4 address here (those with one: ", have, ")");
    return found;
  }
  auto route_to = [](const std::string& host) -> std::string {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    if (host.empty() || getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
    std::string out;
    // Connecting a UDP socket sends nothing: it only asks the kernel which address it would use.
    const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          local.sin_addr.s_addr != htonl(INADDR_ANY)) {
        char ip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &local.sin_addr, ip, sizeof ip);
        out = ip;
      }
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return out;
  };
  std::string a = route_to(peer_host);
  if (!a.empty()) return a;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    addrinfo* res = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &res) == 0 && res != nullptr) {
      char ip[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof ip);
      a = ip;
      freeaddrinfo(res);
      return a;
    }
  }
  return "127.0.0.1";
}

}  // namespace ringreduce

#include "transport/registry.h"

#include "common/error.h"

namespace ringreduce {

namespace {

std::unique_ptr<Transport> make_shm(const LinkSetup& s, const std::vector<uint8_t>& want, bool probe,
                                    std::vector<uint8_t>& reached) {
  auto t = probe ? std::make_unique<ShmTransport>(s.bs, s.prefix, s.rank, s.size, s.opts.shm,
                                                  ShmTransport::Reach::Probe)
                 : std::make_unique<ShmTransport>(s.bs, s.prefix, s.rank, s.size, s.opts.shm,
                                                  ShmTransport::Reach::Require, want);
  for (int p = 0; p < s.size; ++p) reached[p] = want[p] && t->is_local(p);
  return t;
}

// TCP reaches every peer: it connects to each wanted one or throws naming those it could not.
std::unique_ptr<Transport> make_tcp(const LinkSetup& s, const std::vector<uint8_t>& want, bool,
                                    std::vector<uint8_t>& reached) {
  TcpConfig tc = s.opts.tcp;
  if (s.opts.listen_address) tc.listen_address = s.opts.listen_address();
  auto t = std::make_unique<TcpTransport>(s.bs, s.prefix, s.rank, s.size, tc, want,
                                          TcpHooks::beside(s.control));
  reached = want;
  return t;
}

// How the segments were made: without a name (memfd), or named in /dev/shm and unlinked once
// mapped.
std::string note_shm(const Transport& t) {
  return detail::cat("segments: ", static_cast<const ShmTransport&>(t).anonymous() ? "memfd" : "/dev/shm");
}

std::string note_tcp(const Transport& t) {
  return "listening on " + static_cast<const TcpTransport&>(t).address();
}

}  // namespace

const std::vector<TransportKind>& transport_kinds() {
  static const std::vector<TransportKind> kinds = {
      {"shm", true, make_shm, note_shm},
      {"tcp", false, make_tcp, note_tcp},
  };
  return kinds;
}

int transport_row(const std::string& name) {
  const auto& kinds = transport_kinds();
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (name == kinds[i].name) return static_cast<int>(i);
  }
  return -1;
}

TransportMode parse_transport_mode(const std::string& text) {
  if (text == "auto" || text.empty()) return "auto";
  if (transport_row(text) >= 0) return text;
  std::string names = "auto";
  for (const TransportKind& k : transport_kinds()) names += detail::cat(", ", k.name);
  throw Error(detail::cat("ringreduce: RINGREDUCE_TRANSPORT=", text, " is not one of ", names));
}

}  // namespace ringreduce

#include "backend/config.h"

#include <sched.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "transport/transport.h"

namespace ringreduce {

namespace {

// "65536", "64K", "4M": a byte count with an optional binary suffix.
uint64_t parse_bytes(const char* var, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  RR_CHECK(end != text && errno == 0, "ringreduce: ", var, "=", text, " is not a byte count");
  uint64_t mult = 1;
  if (*end) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(*end)));
    mult = s == 'K' ? 1ull << 10 : s == 'M' ? 1ull << 20 : s == 'G' ? 1ull << 30 : 0;
    const char* rest = end + 1;
    if (*rest == 'i' || *rest == 'I') ++rest;
    if (*rest == 'b' || *rest == 'B') ++rest;
    RR_CHECK(mult != 0 && *rest == '\0', "ringreduce: ", var, "=", text,
             " is not a byte count (use digits with an optional K, M or G)");
  }
  return v * mult;
}

uint64_t parse_uint(const char* var, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  RR_CHECK(end != text && *end == '\0' && errno == 0, "ringreduce: ", var, "=", text,
           " is not a non-negative integer");
  return v;
}

}  // namespace

bool Config::oversubscribed(int local_ranks) {
  // The CPUs this process may run on, which is what its peers get too (taskset, cgroups).
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return local_ranks > cpus;
}

std::chrono::microseconds Config::default_spin(int local_ranks) {
  return std::chrono::microseconds(oversubscribed(local_ranks) ? 2 : 50);
}

std::chrono::microseconds Config::default_yield(int local_ranks) {
  return std::chrono::microseconds(oversubscribed(local_ranks) ? 2000 : 0);
}

size_t Config::default_slice_bytes(int local_ranks) {
  return oversubscribed(local_ranks) ? (512u << 10) : (128u << 10);
}

Config Config::from_env(int local_ranks) {
  Config c;
  c.spin = default_spin(local_ranks);
  c.yield = default_yield(local_ranks);
  c.slice_bytes = default_slice_bytes(local_ranks);
  if (const char* v = std::getenv("RINGREDUCE_SLICE_BYTES")) {
    const uint64_t b = parse_bytes("RINGREDUCE_SLICE_BYTES", v);
    RR_CHECK(b >= 64 && b <= (64ull << 20) && b % 64 == 0, "ringreduce: RINGREDUCE_SLICE_BYTES=", v,
             " must be a multiple of 64 between 64 and 64M");
    c.slice_bytes = b;
  }
  if (const char* v = std::getenv("RINGREDUCE_CUDA_SLICE_BYTES")) {
    const uint64_t b = parse_bytes("RINGREDUCE_CUDA_SLICE_BYTES", v);
    RR_CHECK(b >= 4096 && b <= (1ull << 30) && b % 4096 == 0, "ringreduce: RINGREDUCE_CUDA_SLICE_BYTES=",
             v, " must be a multiple of 4096 between 4K and 1G");
    c.cuda_slice_bytes = b;
  }
  if (const char* v = std::getenv("RINGREDUCE_CUDA_TRANSPORT")) {
    const std::string m = v;
    RR_CHECK(m == "auto" || m == "ipc" || m == "staged", "ringreduce: RINGREDUCE_CUDA_TRANSPORT=", v,
             " must be auto, ipc or staged");
    c.cuda_transport = m;
  }
  if (const char* v = std::getenv("RINGREDUCE_SLOTS")) {
    const uint64_t s = parse_uint("RINGREDUCE_SLOTS", v);
    RR_CHECK(s >= 2 && s <= 64, "ringreduce: RINGREDUCE_SLOTS=", v, " must be between 2 and 64");
    c.slots = static_cast<uint32_t>(s);
  }
  if (const char* v = std::getenv("RINGREDUCE_TRANSPORT")) c.transport = parse_transport_mode(v);
  if (const char* v = std::getenv("RINGREDUCE_TCP_SOCKETS")) {
    const uint64_t n = parse_uint("RINGREDUCE_TCP_SOCKETS", v);
    RR_CHECK(n >= 1 && n <= 16, "ringreduce: RINGREDUCE_TCP_SOCKETS=", v, " must be between 1 and 16");
    c.tcp_sockets = static_cast<uint32_t>(n);
  }
  if (const char* v = std::getenv("RINGREDUCE_CHECK_FINGERPRINTS")) {
    const uint64_t b = parse_uint("RINGREDUCE_CHECK_FINGERPRINTS", v);
    RR_CHECK(b <= 1, "ringreduce: RINGREDUCE_CHECK_FINGERPRINTS=", v, " must be 0 or 1");
    c.check_fingerprints = b == 1;
  }
  if (const char* v = std::getenv("RINGREDUCE_SPIN_US")) {
    const uint64_t us = parse_uint("RINGREDUCE_SPIN_US", v);
    RR_CHECK(us <= 1000000, "ringreduce: RINGREDUCE_SPIN_US=", v, " must be at most 1000000");
    c.spin = std::chrono::microseconds(us);
  }
  if (const char* v = std::getenv("RINGREDUCE_ALGO")) c.algo = parse_algo(v, "RINGREDUCE_ALGO");
  if (const char* v = std::getenv("RINGREDUCE_WINDOW_BYTES")) {
    const uint64_t b = parse_bytes("RINGREDUCE_WINDOW_BYTES", v);
    RR_CHECK(b <= (256ull << 20) && b % 64 == 0, "ringreduce: RINGREDUCE_WINDOW_BYTES=", v,
             " must be a multiple of 64 up to 256M (0 turns the one-shot and two-shot algorithms off)");
    c.window_bytes = b;
  }
  if (const char* v = std::getenv("RINGREDUCE_FAKE_HOSTS")) {
    const uint64_t h = parse_uint("RINGREDUCE_FAKE_HOSTS", v);
    RR_CHECK(h <= 65536, "ringreduce: RINGREDUCE_FAKE_HOSTS=", v, " must be at most 65536");
    c.fake_hosts = static_cast<int>(h);
  }
  if (const char* v = std::getenv("RINGREDUCE_YIELD_US")) {
    const uint64_t us = parse_uint("RINGREDUCE_YIELD_US", v);
    RR_CHECK(us <= 1000000, "ringreduce: RINGREDUCE_YIELD_US=", v, " must be at most 1000000");
    c.yield = std::chrono::microseconds(us);
  }
  return c;
}

Config Config::agree(Bootstrap& bs, const std::string& prefix, int rank, int local_ranks) {
  const std::string key = prefix + "config";
  std::string text;
  if (rank == 0) {
    const Config mine = from_env(local_ranks);
    std::ostringstream s;
    s << mine.slice_bytes << ' ' << mine.slots << ' ' << mine.spin.count() << ' '
      << transport_mode_name(mine.transport) << ' ' << mine.tcp_sockets << ' '
      << (mine.check_fingerprints ? 1 : 0) << ' ' << mine.cuda_slice_bytes << ' ' << mine.cuda_transport
      << ' ' << mine.yield.count() << ' ' << algo_name(mine.algo) << ' ' << mine.window_bytes << ' '
      << mine.fake_hosts;
    text = s.str();
    bs.set(key, text);
  } else {
    text = bs.get(key);
  }
  std::istringstream in(text);
  Config c;
  long long spin_us = 0, yield_us = 0;
  std::string mode, algo;
  int check = 1;
  in >> c.slice_bytes >> c.slots >> spin_us >> mode >> c.tcp_sockets >> check >> c.cuda_slice_bytes >> c.cuda_transport >> yield_us >> algo >> c.window_bytes >> c.fake_hosts;
  c.check_fingerprints = check != 0;
  if (!in.fail()) c.transport = parse_transport_mode(mode);
  RR_CHECK(!in.fail(), "ringreduce: rank ", rank, " read a malformed config from the store: '", text, "'");
  c.spin = std::chrono::microseconds(spin_us);
  c.yield = std::chrono::microseconds(yield_us);
  c.algo = parse_algo(algo, "the agreed algorithm");
  return c;
}

std::string Config::to_string() const {
  std::ostringstream s;
  s << "slice_bytes=" << slice_bytes << " slots=" << slots << " spin_us=" << spin.count() << " yield_us=" << yield.count()
    << " transport=" << transport_mode_name(transport) << " tcp_sockets=" << tcp_sockets
    << " check_fingerprints=" << (check_fingerprints ? 1 : 0) << " cuda_slice_bytes=" << cuda_slice_bytes
    << " cuda_transport=" << cuda_transport << " algo=" << algo_name(algo)
    << " window_bytes=" << window_bytes << " fake_hosts=" << fake_hosts;
  return s.str();
}

}  // namespace ringreduce

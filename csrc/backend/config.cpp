#include "backend/config.h"

#include <sched.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <fstream>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <sstream>

#include "backend/knobs.h"
#include "common/error.h"
#include "common/machine.h"
#include "transport/hosts.h"
#include "transport/transport.h"

extern char** environ;

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
  return std::chrono::microseconds(oversubscribed(local_ranks) ? 1 : 50);
}

std::chrono::microseconds Config::default_spin_max(int local_ranks) {
  return oversubscribed(local_ranks) ? default_spin(local_ranks) : std::chrono::microseconds(1000);
}

std::chrono::microseconds Config::default_yield(int local_ranks) {
  return std::chrono::microseconds(oversubscribed(local_ranks) ? 2000 : 0);
}

size_t Config::default_slice_bytes(int local_ranks) {
  return oversubscribed(local_ranks) ? (512u << 10) : (128u << 10);
}

namespace {

// Each knob of RINGREDUCE_CONFIG_KNOBS (knobs.h) has a setter here, named after its field, that
// parses a value, checks its range and stores it; a knob added to the table without one does not
// compile. `var` names the variable in the error.
void set_slice_bytes(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_bytes(var, v);
  RR_CHECK(b >= 64 && b <= (64ull << 20) && b % 64 == 0, "ringreduce: ", var, "=", v,
           " must be a multiple of 64 between 64 and 64M");
  c.slice_bytes = b;
}

void set_stream(Config& c, const char* var, const char* v) { c.stream = SlotWrites::parse(v, var); }

void set_stream_bytes(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_bytes(var, v);
  RR_CHECK(b <= (1ull << 40), "ringreduce: ", var, "=", v, " must be at most 1T");
  c.stream_bytes = b;
}

void set_cuda_slice_bytes(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_bytes(var, v);
  RR_CHECK(b >= 4096 && b <= (1ull << 30) && b % 4096 == 0, "ringreduce: ", var, "=", v,
           " must be a multiple of 4096 between 4K and 1G");
  c.cuda_slice_bytes = b;
}

void set_cuda_transport(Config& c, const char* var, const char* v) {
  const std::string m = v;
  RR_CHECK(m == "auto" || m == "ipc" || m == "staged", "ringreduce: ", var, "=", v,
           " must be auto, ipc or staged");
  c.cuda_transport = m;
}

void set_cuda_window_bytes(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_bytes(var, v);
  RR_CHECK(b == 0 || (b >= 4096 && b <= (1ull << 32) && b % 4096 == 0), "ringreduce: ", var, "=", v,
           " must be 0 (off) or a multiple of 4096 between 4K and 4G");
  c.cuda_window_bytes = b;
}

void set_slots(Config& c, const char* var, const char* v) {
  const uint64_t s = parse_uint(var, v);
  RR_CHECK(s >= 2 && s <= 64, "ringreduce: ", var, "=", v, " must be between 2 and 64");
  c.slots = static_cast<uint32_t>(s);
}

void set_transport(Config& c, const char*, const char* v) { c.transport = parse_transport_mode(v); }

void set_tcp_sockets(Config& c, const char* var, const char* v) {
  const uint64_t n = parse_uint(var, v);
  RR_CHECK(n >= 1 && n <= 16, "ringreduce: ", var, "=", v, " must be between 1 and 16");
  c.tcp_sockets = static_cast<uint32_t>(n);
}

void set_check_fingerprints(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_uint(var, v);
  RR_CHECK(b <= 1, "ringreduce: ", var, "=", v, " must be 0 or 1");
  c.check_fingerprints = b == 1;
}

void set_spin(Config& c, const char* var, const char* v) {
  const uint64_t us = parse_uint(var, v);
  RR_CHECK(us <= 1000000, "ringreduce: ", var, "=", v, " must be at most 1000000");
  c.spin = std::chrono::microseconds(us);
}

void set_spin_max(Config& c, const char* var, const char* v) {
  const uint64_t us = parse_uint(var, v);
  RR_CHECK(us <= 1000000, "ringreduce: ", var, "=", v, " must be at most 1000000");
  c.spin_max = std::chrono::microseconds(us);
}

void set_yield(Config& c, const char* var, const char* v) {
  const uint64_t us = parse_uint(var, v);
  RR_CHECK(us <= 1000000, "ringreduce: ", var, "=", v, " must be at most 1000000");
  c.yield = std::chrono::microseconds(us);
}

void set_async_start(Config& c, const char* var, const char* v) {
  const uint64_t us = parse_uint(var, v);
  RR_CHECK(us <= 1000000, "ringreduce: ", var, "=", v, " must be at most 1000000");
  c.async_start = std::chrono::microseconds(us);
}

void set_algo(Config& c, const char* var, const char* v) { c.algo = parse_algo(v, var); }

void set_window_bytes(Config& c, const char* var, const char* v) {
  const uint64_t b = parse_bytes(var, v);
  RR_CHECK(b <= (256ull << 20) && b % 64 == 0, "ringreduce: ", var, "=", v,
           " must be a multiple of 64 up to 256M (0 turns the one-shot and two-shot algorithms off)");
  c.window_bytes = b;
}

void set_fake_hosts(Config& c, const char* var, const char* v) {
  const uint64_t h = parse_uint(var, v);
  RR_CHECK(h <= 65536, "ringreduce: ", var, "=", v, " must be at most 65536");
  c.fake_hosts = static_cast<int>(h);
}

// A field's value as to_string() prints it, in a form its setter reads back (Config::agree).
std::string show(uint64_t v) { return std::to_string(v); }
std::string show(uint32_t v) { return std::to_string(v); }
std::string show(int v) { return std::to_string(v); }
std::string show(bool v) { return v ? "1" : "0"; }
std::string show(std::chrono::microseconds v) { return std::to_string(v.count()); }
std::string show(Algo v) { return algo_name(v); }
std::string show(SlotWrites::Mode v) { return SlotWrites::name(v); }
std::string show(const std::string& v) { return v; }

struct ConfigKnob {
  const char* var;
  void (*set)(Config&, const char* var, const char* text);
  std::string (*get)(const Config&);
};

#define RR_CONFIG_KNOB(field, name, kind, def, meaning) \
  ConfigKnob{name, &set_##field, [](const Config& c) { return show(c.field); }},
const ConfigKnob kConfigKnobs[] = {RINGREDUCE_CONFIG_KNOBS(RR_CONFIG_KNOB)};
#undef RR_CONFIG_KNOB

// to_string()'s key for a knob: RINGREDUCE_SPIN_US -> spin_us.
std::string key_of(const char* var) {
  constexpr size_t kPrefix = sizeof("RINGREDUCE_") - 1;
  std::string k = var + kPrefix;
  for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return k;
}

}  // namespace

Config Config::from_env(int local_ranks) {
  Config c;
  c.spin = default_spin(local_ranks);
  c.spin_max = default_spin_max(local_ranks);
  c.yield = default_yield(local_ranks);
  c.slice_bytes = default_slice_bytes(local_ranks);
  for (const ConfigKnob& k : kConfigKnobs) {
    if (const char* v = std::getenv(k.var)) k.set(c, k.var, v);
  }
  // A spin set by hand stays as set, unless its limit is set too.
  if (std::getenv("RINGREDUCE_SPIN_US") != nullptr && std::getenv("RINGREDUCE_SPIN_MAX_US") == nullptr) {
    c.spin_max = c.spin;
  }
  return c;
}

namespace {

// Levenshtein distance, for "did you mean" (knob names are short; this runs once per variable).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Each warning once per process, however many groups are made.
bool first_time(const std::string& key) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  return said.insert(key).second;
}

}  // namespace

std::string Config::closest_knob(const std::string& name) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const Knob& k : kKnobs) {
    const size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = k.name;
    }
  }
  return best;
}

std::vector<std::string> Config::knob_warnings(const Config& agreed, int rank, char** env) {
  std::vector<std::string> out;
  for (char** e = env; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("RINGREDUCE_", 0) != 0) continue;
    const size_t eq = entry.find('=');
    const std::string name = entry.substr(0, eq);
    bool known = false;
    for (const Knob& k : kKnobs) known = known || name == k.name;
    if (!known) {
      out.push_back(detail::cat("ringreduce: ", name, " is not a ringreduce knob and is ignored; did you mean ",
                                closest_knob(name), "? (python -m ringreduce.info --knobs lists them)"));
    }
  }
  if (rank == 0) return out;
  // The agreed knobs are read on rank 0 only: a different value here is not used, say so.
  for (const ConfigKnob& k : kConfigKnobs) {
    const char* v = std::getenv(k.var);
    if (v == nullptr) continue;
    Config mine = agreed;
    std::string why;
    try {
      k.set(mine, k.var, v);
    } catch (const std::exception& e) {
      why = detail::cat(" (", e.what(), ")");
    }
    const std::string theirs = k.get(agreed);
    if (!why.empty() || k.get(mine) != theirs) {
      out.push_back(detail::cat("ringreduce: rank ", rank, ": ", k.var, "=", v, why,
                                " is not used: the group uses rank 0's value, ", key_of(k.var), "=",
                                theirs, " (agreed knobs are read on rank 0; set them alike on every rank)"));
    }
  }
  return out;
}

std::string Config::machine_key() { return machine_id(); }

int Config::local_ranks(const std::vector<std::string>& keys, int fake_hosts) {
  const int size = static_cast<int>(keys.size());
  std::vector<int> block(static_cast<size_t>(size), 0);
  if (fake_hosts > 0) {
    const HostLayout fake = HostLayout::split(size, fake_hosts);
    for (int r = 0; r < size; ++r) block[r] = fake.host_of(r);
  }
  int n = 0;
  for (int r = 0; r < size; ++r) n += keys[r] == keys[0] && block[r] == block[0];
  return n;
}

Config Config::agree(Bootstrap& bs, const std::string& prefix, int rank, int size) {
  // Published as to_string() prints it, and read back through the same setters as the variables.
  const std::string key = prefix + "config";
  // Rank 0's crowded-core defaults are for the ranks of its own machine, not the whole group: a
  // group of 2 hosts x 8 ranks on 8-core hosts has a core per rank.
  bs.set(prefix + "machine/" + std::to_string(rank), machine_key());
  std::string text;
  int local = 0;
  if (rank == 0) {
    std::vector<std::string> keys(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) keys[r] = r == 0 ? machine_key() : bs.get(prefix + "machine/" + std::to_string(r));
    local = local_ranks(keys, from_env(size).fake_hosts);
    text = from_env(local).to_string();
    bs.set(prefix + "machine/local", std::to_string(local));
    bs.set(key, text);
  } else {
    text = bs.get(key);
    local = std::atoi(bs.get(prefix + "machine/local").c_str());
  }
  Config c;
  c.local_ranks_seen = local;
  std::istringstream in(text);
  std::string item;
  constexpr size_t n = std::size(kConfigKnobs);
  static_assert(n < 64);
  uint64_t seen = 0;  // bit i: kConfigKnobs[i] was read, each knob exactly once
  while (in >> item) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    size_t i = 0;
    while (i < n && (eq == std::string::npos || name != key_of(kConfigKnobs[i].var))) ++i;
    RR_CHECK(i < n && !(seen >> i & 1), "ringreduce: rank ", rank,
             " read a malformed config from the store: '", text, "'");
    kConfigKnobs[i].set(c, kConfigKnobs[i].var, item.c_str() + eq + 1);
    seen |= uint64_t{1} << i;
  }
  RR_CHECK(seen == (uint64_t{1} << n) - 1, "ringreduce: rank ", rank,
           " read a malformed config from the store: '", text, "'");
  for (const std::string& w : knob_warnings(c, rank, environ)) {
    if (first_time(w)) TORCH_WARN(w);
  }
  return c;
}

std::string Config::to_string() const {
  std::string s;
  for (const ConfigKnob& k : kConfigKnobs) {
    s += detail::cat(s.empty() ? "" : " ", key_of(k.var), "=", k.get(*this));
  }
  return s;
}

}  // namespace ringreduce

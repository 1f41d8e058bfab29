// Which machine this process runs on, for telling the ranks of one machine from the others'.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>

namespace ringreduce {

// The kernel's boot id is the same for every process of one machine, in any container, and
// differs between machines (and across reboots); the host name stands in where it is hidden.
inline std::string machine_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (f && std::getline(f, id) && !id.empty()) return id;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string("host:") + host;
}

// Bytes of the largest cache private to one core (the largest cache of CPU 0 shared with no CPU
// but its own hyperthreads, usually its L2), from sysfs; `fallback` where that cannot be read.
// Every process of one machine reads the same answer: CPU 0's, not its own CPU's, which differ
// on hybrid parts.
inline size_t private_cache_bytes(size_t fallback) {
  std::string core = "0";
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list");
    std::string s;
    if (f >> s) core = s;
  }
  size_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream size_f(dir + "size"), shared_f(dir + "shared_cpu_list");
    std::string size, shared;
    if (!(size_f >> size) || !(shared_f >> shared)) break;
    if (shared != core) continue;  // shared with other cores
    char* end = nullptr;
    size_t bytes = std::strtoull(size.c_str(), &end, 10);
    if (end != nullptr && (*end == 'K' || *end == 'k')) bytes <<= 10;
    if (end != nullptr && (*end == 'M' || *end == 'm')) bytes <<= 20;
    if (bytes > best) best = bytes;
  }
  return best != 0 ? best : fallback;
}

}  // namespace ringreduce

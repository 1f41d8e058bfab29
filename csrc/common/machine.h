// Which machine this process runs on, for telling the ranks of one machine from the others'.
#pragma once

#include <unistd.h>

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

}  // namespace ringreduce

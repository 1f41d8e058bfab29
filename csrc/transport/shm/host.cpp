#include "transport/shm/host.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

namespace ringreduce {
namespace shm {

char process_state(int32_t pid) {
  if (pid <= 0) return '?';
  if (pid == static_cast<int32_t>(getpid())) return 'R';
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return errno == ENOENT ? 'X' : '?';
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')', as comm may hold anything.
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr || close_paren[1] != ' ') return '?';
  return close_paren[2] == 't' ? 'T' : close_paren[2];  // traced counts as stopped
}

bool process_gone(int32_t pid) {
  const char state = process_state(pid);
  return state == 'Z' || state == 'X';
}

uint64_t pid_namespace() {
  static const uint64_t ns = [] {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
  }();
  return ns;
}

uint64_t mount_namespace() {
  struct stat st;
  return stat("/proc/self/ns/mnt", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

uint64_t net_namespace() {
  struct stat st;
  return stat("/proc/self/ns/net", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A segment whose creator died before it unlinked it (killed during set-up, between creating it
// and every peer mapping it): nobody holds the lock on it that every live owner holds from its
// first microseconds on, and it is older than that moment. Swept once per process, at its first
// group's set-up.
constexpr std::chrono::seconds kStaleAfter{1};

void sweep_stale_segments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("ringreduce-", 0) != 0) continue;
    const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    if (fd < 0) continue;  // another user's, or gone meanwhile
    struct stat st;
    const bool old = fstat(fd, &st) == 0 &&
                     now - (std::chrono::seconds(st.st_ctim.tv_sec) +
                            std::chrono::nanoseconds(st.st_ctim.tv_nsec)) > kStaleAfter;
    if (old && flock(fd, LOCK_EX | LOCK_NB) == 0) shm_unlink(("/" + name).c_str());
    close(fd);
  }
  closedir(dir);
}

int create_memfd(const std::string& name) {
#ifdef SYS_memfd_create
  return static_cast<int>(syscall(SYS_memfd_create, name.c_str(), 1u /* MFD_CLOEXEC */));
#else
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace shm
}  // namespace ringreduce

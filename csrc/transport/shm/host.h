// What a shared-memory rank learns about its machine outside the group's segments: which
// namespaces this process is in, what state a peer's process is in, the segments left in
// /dev/shm by ranks that died, and how a segment without a name is made.
#pragma once

#include <cstdint>
#include <string>

namespace ringreduce {
namespace shm {

// The state letter of process `pid` in /proc ('R', 'S', 'T', 'Z', ...; 'X' once it is gone, '?'
// when it cannot be read). Our own pid (ranks as threads of one process, in the C++ tests) is
// always 'R'.
char process_state(int32_t pid);
// Whether process `pid` has exited (or is a zombie, not reaped yet).
bool process_gone(int32_t pid);

// This process's PID, mount and network namespaces (the inodes of /proc/self/ns/...), 0 where
// unknown. A pid is only worth looking up in /proc by a process of the same PID namespace; abstract
// Unix sockets live in the network namespace.
uint64_t pid_namespace();
uint64_t mount_namespace();
uint64_t net_namespace();

// Unlinks the segments of ringreduce groups in /dev/shm whose creator died before it unlinked them.
void sweep_stale_segments();

// A memfd named `name` (close-on-exec), or -1 with errno set.
int create_memfd(const std::string& name);

}  // namespace shm
}  // namespace ringreduce

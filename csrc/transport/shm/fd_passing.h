// A segment's descriptor handed to the peers of its machine through a Unix-domain socket in the
// abstract namespace (SCM_RIGHTS), for peers that cannot open it through /proc/<pid>/fd: ranks in
// containers of their own (other PID or mount namespaces) that share the network namespace, as the
// containers of one Kubernetes pod do. The abstract namespace belongs to the network namespace, so
// ranks kept apart there (other hosts, or the hosts tests/test_netns.py makes) never meet.
//
// Anyone in the network namespace can see an abstract socket, so the descriptor goes only to a
// process of the owner's user that first sends the segment's secret, a random value the owner
// publishes through the group's store beside the socket's name.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace ringreduce {

// Serves `fd` (not owned; it must outlive this) at the abstract socket `name` from a thread of its
// own, until destroyed.
class FdServer {
 public:
  // Throws ringreduce::Error when the socket cannot be made (the name is taken, or the machine's
  // policy forbids it).
  FdServer(const std::string& name, int fd, uint64_t secret);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

 private:
  void serve();
  void answer(int conn);

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: the destructor ends the serving thread's poll at once
  int fd_;
  uint64_t secret_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The descriptor the FdServer at `name` serves, reopened as an open file of this process's own
// (so that a lock taken on it is this process's, not shared with the owner's); -1 with *why set
// when it could not be had before `deadline` (no such server, a server of another user, refused).
int fetch_fd(const std::string& name, uint64_t secret, std::chrono::steady_clock::time_point deadline,
             std::string* why);

}  // namespace ringreduce

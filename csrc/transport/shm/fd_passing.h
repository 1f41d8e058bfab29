// A segment's descriptor handed to the peers of its machine through a Unix-domain socket in the
// abstract namespace (SCM_RIGHTS), for peers that cannot open it through /proc/<pid>/fd: ranks in
// containers of their own (other PID or mount namespaces) that share the network namespace, as the
// containers of one Kubernetes pod do. The abstract namespace belongs to the network namespace, so
// ranks kept apart there (other hosts, or the hosts tests/test_netns.py makes) never meet.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace ringreduce {

// Serves `fd` to every process of this user that connects to the abstract socket `name`, from a
// thread of its own, until destroyed. A process of another user is refused (SO_PEERCRED).
class FdServer {
 public:
  // Throws ringreduce::Error when the socket cannot be made (the name is taken, say).
  FdServer(const std::string& name, int fd);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

 private:
  void serve();

  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: the destructor ends the serving thread's poll at once
  int fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The descriptor the FdServer at `name` serves, reopened as an open file of this process's own
// (so that a lock taken on it is this process's, not shared with the owner's); -1 when there is no
// such server, it refused, or nothing came within `timeout`.
int fetch_fd(const std::string& name, std::chrono::milliseconds timeout);

}  // namespace ringreduce

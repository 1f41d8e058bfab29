// torch's monitored barrier (ProcessGroup.monitored_barrier), over the group's store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace ringreduce {

// Every rank reports its arrival under `prefix`; rank 0 waits for each peer until `timeout`, then
// releases them. A rank that does not arrive makes rank 0 fail naming it ("Rank 2 failed to pass
// monitoredBarrier in 1000 ms", the words gloo uses, which scripts match), or naming every such
// rank when `wait_all` is set; the other ranks then fail at their own timeout, pointing at rank 0's
// error. It uses the store, not the group's transport, so it works whatever state the data path
// is in: it is the tool for finding a rank that is stuck.
void monitored_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                       std::chrono::milliseconds timeout, bool wait_all);

}  // namespace ringreduce

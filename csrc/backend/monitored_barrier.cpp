#include "backend/monitored_barrier.h"

#include <c10/util/Exception.h>

#include <thread>
#include <vector>

#include "common/error.h"

namespace ringreduce {

namespace {

using Clock = std::chrono::steady_clock;

// Polls for `key` until `until`: the store's own wait would block for its timeout, not ours.
bool appears(c10d::Store& store, const std::string& key, Clock::time_point until) {
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    if (store.check({key})) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

std::string arrived_key(const std::string& prefix, int rank) {
  return detail::cat(prefix, "arrived/", rank);
}

}  // namespace

void monitored_barrier(c10d::Store& store, const std::string& prefix, int rank, int size,
                       std::chrono::milliseconds timeout, bool wait_all) {
  if (size == 1) return;
  const Clock::time_point until = Clock::now() + timeout;
  const std::string released = prefix + "released";
  if (rank != 0) {
    store.set(arrived_key(prefix, rank), std::vector<uint8_t>{1});
    if (!appears(store, released, until)) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat("ringreduce monitored_barrier: Rank ", rank,
                                  " successfully reached monitoredBarrier, but was not released by "
                                  "rank 0 within ", timeout.count(), " ms. Please check rank 0's "
                                  "error for the rank that failed to arrive."));
    }
    return;
  }
  std::vector<int> missing;
  for (int p = 1; p < size; ++p) {
    // Once the deadline has passed, a rank still gets a last look (it may have arrived meanwhile).
    if (appears(store, arrived_key(prefix, p), until)) continue;
    if (!wait_all) {
      C10_THROW_ERROR(DistBackendError,
                      detail::cat("ringreduce monitored_barrier: [Rank 0]: Rank ", p,
                                  " failed to pass monitoredBarrier in ", timeout.count(), " ms"));
    }
    missing.push_back(p);
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int p : missing) ranks += detail::cat(ranks.empty() ? "" : ", ", p);
    C10_THROW_ERROR(DistBackendError,
                    detail::cat("ringreduce monitored_barrier: [Rank 0]: Ranks ", ranks,
                                " failed to pass monitoredBarrier in ", timeout.count(), " ms"));
  }
  for (int p = 1; p < size; ++p) store.deleteKey(arrived_key(prefix, p));
  store.set(released, std::vector<uint8_t>{1});
}

}  // namespace ringreduce

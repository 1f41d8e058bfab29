// The store, in process, for the C++ tests that run ranks as threads: get() waits for the key,
// with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "transport/transport.h"

namespace ringreduce {

// How long rank 0 of a test's group waits for the others to join (incarnation_prefix).
inline constexpr std::chrono::milliseconds kJoinTimeout{30000};

class MapBootstrap : public Bootstrap {
 public:
  void set(const std::string& k, const std::string& v) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      kv_[k] = v;
    }
    cv_.notify_all();
  }
  int64_t add(const std::string& k, int64_t delta) override {
    std::lock_guard<std::mutex> l(mu_);
    const int64_t v = (kv_.count(k) ? std::stoll(kv_[k]) : 0) + delta;
    kv_[k] = std::to_string(v);
    return v;
  }
  std::string get(const std::string& k) override {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, std::chrono::seconds(20), [&] { return kv_.count(k) > 0; })) {
      throw Error("test bootstrap: timed out waiting for key " + k);
    }
    return kv_[k];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

}  // namespace ringreduce

// The c10d store seen as the core's Bootstrap.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "common/error.h"
#include "transport/transport.h"

namespace ringreduce {

class StoreBootstrap final : public Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  // Set-up that fails on one rank must fail on every rank at once, not leave the others waiting
  // for keys that will never come until the store's timeout. Once watch() names the key where a
  // failing rank of this group incarnation says why (fail()), get() waits for its key or that
  // one, whichever comes first, and throws the failing rank's reason.
  void watch(std::string failure_key, int size) {
    failure_key_ = std::move(failure_key);
    size_ = size;
  }
  // Publishes why this rank cannot go on (a rank that learnt of a peer's failure has nothing to
  // add), then waits (two seconds at most) until every rank knows: it read the reason, or failed
  // itself. Every rank waits, not only the one that failed first: the store may live in any of
  // them (rank 0's TCPStore under env://), and once that process exits the ranks still reading
  // would only learn that the store went away.
  void fail(const std::string& why) noexcept {
    if (failure_key_.empty()) return;
    try {
      if (!peer_failed_) {
        set(failure_key_, why);
        store_->add(failure_key_ + "/known", 1);  // a rank that read the reason counted itself in get()
      }
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (store_->add(failure_key_ + "/known", 0) < size_ &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    } catch (...) {  // a store out of reach: the caller's own error is the one to report
    }
  }
  bool peer_failed() const { return peer_failed_; }

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  // Waits for the key up to the store's own timeout and throws past it.
  std::string get(const std::string& key) override {
    if (failure_key_.empty()) return plain_get(key);
    const auto deadline = std::chrono::steady_clock::now() + store_->getTimeout();
    auto pause = std::chrono::microseconds(200);
    while (!store_->check({key})) {
      if (store_->check({failure_key_})) {
        peer_failed_ = true;
        const std::string why = plain_get(failure_key_);
        store_->add(failure_key_ + "/known", 1);
        throw Error(why);
      }
      if (std::chrono::steady_clock::now() >= deadline) return plain_get(key);  // the store's error
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    return plain_get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

 private:
  std::string plain_get(const std::string& key) {
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string failure_key_;
  int size_ = 1;
  bool peer_failed_ = false;
};

}  // namespace ringreduce

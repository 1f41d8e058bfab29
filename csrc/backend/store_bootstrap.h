// The c10d store seen as the core's Bootstrap.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "transport/transport.h"

namespace ringreduce {

class StoreBootstrap final : public Bootstrap {
 public:
  explicit StoreBootstrap(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  // Store::get waits for the key up to the store's own timeout and throws past it.
  std::string get(const std::string& key) override {
    const std::vector<uint8_t> v = store_->get(key);
    return std::string(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace ringreduce

#include "backend/storage_pins.h"

#include <mutex>
#include <unordered_map>

namespace ringreduce {

namespace {

struct Pin {
  int count = 0;
  bool was_resizable = false;
};

// Per storage: how many live StoragePins hold it, and whether it was resizable before the first.
std::mutex& pins_mu() {
  static std::mutex mu;
  return mu;
}

std::unordered_map<const c10::StorageImpl*, Pin>& pins() {
  static auto* m = new std::unordered_map<const c10::StorageImpl*, Pin>();  // outlives exit
  return *m;
}

}  // namespace

at::Tensor held(const at::Tensor& t, bool async) {
  if (!async || !t.defined()) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  // What detach() does, without a trip through the dispatcher: same storage, own metadata, the
  // same version counter (an in-place result still bumps the caller's tensor's version).
  return at::Tensor(impl->shallow_copy_and_detach(impl->version_counter(),
                                                  /*allow_tensor_metadata_change=*/false));
}

std::vector<at::Tensor> held(const std::vector<at::Tensor>& ts, bool async) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(held(t, async));
  return out;
}

std::vector<std::vector<at::Tensor>> held(const std::vector<std::vector<at::Tensor>>& ts,
                                          bool async) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(ts.size());
  for (const std::vector<at::Tensor>& list : ts) out.push_back(held(list, async));
  return out;
}

StoragePins::StoragePins(std::initializer_list<const std::vector<at::Tensor>*> lists) {
  std::lock_guard<std::mutex> lock(pins_mu());
  for (const std::vector<at::Tensor>* list : lists) {
    for (const at::Tensor& t : *list) {
      if (!t.defined() || !t.has_storage()) continue;
      c10::Storage s = t.storage();
      c10::StorageImpl* impl = s.unsafeGetStorageImpl();
      if (impl == nullptr) continue;
      bool seen = false;
      for (const c10::Storage& mine : storages_) seen = seen || mine.unsafeGetStorageImpl() == impl;
      if (seen) continue;
      Pin& p = pins()[impl];
      if (p.count++ == 0) {
        p.was_resizable = impl->resizable();
        impl->set_resizable(false);
      }
      storages_.push_back(std::move(s));
    }
  }
}

StoragePins::~StoragePins() {
  std::lock_guard<std::mutex> lock(pins_mu());
  for (const c10::Storage& s : storages_) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    auto it = pins().find(impl);
    if (it == pins().end()) continue;
    if (--it->second.count == 0) {
      impl->set_resizable(it->second.was_resizable);
      pins().erase(it);
    }
  }
}

}  // namespace ringreduce

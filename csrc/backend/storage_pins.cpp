#include "backend/storage_pins.h"

#include <mutex>
#include <vector>

namespace ringreduce {

namespace {

struct Pin {
  const c10::StorageImpl* storage = nullptr;
  int count = 0;
  bool was_resizable = false;
};

// Per pinned storage: how many live StoragePins hold it, and whether it was resizable before the
// first. A flat list: only the storages of ops in flight are in it (one or two per op, a handful
// of ops), where a hash map's node per pin cost an allocation per async op.
std::mutex& pins_mu() {
  static std::mutex mu;
  return mu;
}

std::vector<Pin>& pins() {
  static auto* v = new std::vector<Pin>();  // outlives exit
  return *v;
}

Pin& pin_of(const c10::StorageImpl* impl) {
  std::vector<Pin>& v = pins();
  for (Pin& p : v) {
    if (p.storage == impl) return p;
  }
  v.push_back(Pin{impl});
  return v.back();
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
      Pin& p = pin_of(impl);
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
  std::vector<Pin>& v = pins();
  for (const c10::Storage& s : storages_) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].storage != impl) continue;
      if (--v[i].count == 0) {
        impl->set_resizable(v[i].was_resizable);
        v[i] = v.back();
        v.pop_back();
      }
      break;
    }
  }
}

}  // namespace ringreduce

#include "backend/storage_pins.h"

#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ringreduce {

namespace {

struct Pin {
  int count = 0;
  bool was_resizable = false;
};

// Per pinned storage: how many live StoragePins hold it, and whether it was resizable before the
// first. Only the storages of ops in flight are here: usually a handful, kept in a flat list (a
// hash map's node per pin cost an allocation per async op); past kFlat of them (a caller that
// issues an op per parameter before waiting) the rest go to a map, so that a lookup stays cheap.
constexpr size_t kFlat = 32;

struct Registry {
  std::vector<std::pair<const c10::StorageImpl*, Pin>> flat;
  std::unordered_map<const c10::StorageImpl*, Pin> more;

  Registry() { flat.reserve(kFlat); }

  Pin* find(const c10::StorageImpl* impl) {
    for (auto& e : flat) {
      if (e.first == impl) return &e.second;
    }
    if (more.empty()) return nullptr;
    auto it = more.find(impl);
    return it == more.end() ? nullptr : &it->second;
  }
  Pin& get(const c10::StorageImpl* impl) {
    if (Pin* p = find(impl)) return *p;
    if (flat.size() < kFlat) return flat.emplace_back(impl, Pin{}).second;
    return more[impl];
  }
  void erase(const c10::StorageImpl* impl) {
    for (size_t i = 0; i < flat.size(); ++i) {
      if (flat[i].first != impl) continue;
      flat[i] = flat.back();
      flat.pop_back();
      return;
    }
    more.erase(impl);
  }
};

std::mutex& pins_mu() {
  static std::mutex mu;
  return mu;
}

Registry& pins() {
  static auto* r = new Registry();  // outlives exit
  return *r;
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
  try {
    for (const std::vector<at::Tensor>* list : lists) {
      for (const at::Tensor& t : *list) {
        if (!t.defined() || !t.has_storage()) continue;
        c10::Storage s = t.storage();
        c10::StorageImpl* impl = s.unsafeGetStorageImpl();
        if (impl == nullptr) continue;
        bool seen = false;
        for (const c10::Storage& mine : storages_) seen = seen || mine.unsafeGetStorageImpl() == impl;
        if (seen) continue;
        storages_.push_back(s);  // first: what release() gives back is exactly what is held
        Pin& p = pins().get(impl);
        if (p.count++ == 0) {
          p.was_resizable = impl->resizable();
          impl->set_resizable(false);
        }
      }
    }
  } catch (...) {
    // No destructor runs for a constructor that throws: what was pinned is given back here.
    release();
    throw;
  }
}

StoragePins::~StoragePins() {
  std::lock_guard<std::mutex> lock(pins_mu());
  release();
}

void StoragePins::release() {
  Registry& r = pins();
  for (const c10::Storage& s : storages_) {
    c10::StorageImpl* impl = s.unsafeGetStorageImpl();
    Pin* p = r.find(impl);
    if (p == nullptr) continue;  // its registry entry was never made (the constructor threw)
    if (--p->count == 0) {
      // Resizable again as it was, if it still can be: a storage moved into shared memory
      // meanwhile (share_memory_) has no allocator to grow with, and torch asserts one.
      impl->set_resizable(p->was_resizable && impl->allocator() != nullptr);
      r.erase(impl);
    }
  }
}

}  // namespace ringreduce

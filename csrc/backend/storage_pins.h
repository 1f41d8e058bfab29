// What keeps an async op's tensors in place while the op may still touch them.
//
// An async op runs on the progress thread after the caller got its Work back, so the caller may
// change its tensors meanwhile. held() gives the op tensors of its own: new TensorImpls over the
// same storages, sizes and strides, so that the caller's set_ or resize_ changes what the caller's
// tensor shows, never what the op reads. And an op hands raw pointers into its tensors' storages to the algorithms and transports. A caller
// who replaces a tensor's storage (t.set_(...)) or grows it (t.resize_(...)) before wait() would
// free that memory under the op: the op would write into freed memory. A StoragePins held for the
// op's lifetime holds a reference to each storage, so a replaced one stays alive (the op's result
// then lands in the storage the tensor had), and marks each one not resizable, so that growing
// one fails at the caller's resize_ with torch's "Trying to resize storage that is not resizable"
// instead of moving the memory. Shrinking needs no new memory and is left alone.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>

#include <vector>

namespace ringreduce {

// The op's own tensors (see above) when `async`; the caller's own when it waits at once.
at::Tensor held(const at::Tensor& t, bool async);
std::vector<at::Tensor> held(const std::vector<at::Tensor>& ts, bool async);
std::vector<std::vector<at::Tensor>> held(const std::vector<std::vector<at::Tensor>>& ts, bool async);

class StoragePins {
 public:
  // Pins the storages of every defined tensor in the lists. A storage pinned by several live
  // StoragePins (overlapping ops) gets its resizability back when the last of them goes.
  StoragePins(std::initializer_list<const std::vector<at::Tensor>*> lists);
  ~StoragePins();
  StoragePins(const StoragePins&) = delete;
  StoragePins& operator=(const StoragePins&) = delete;

 private:
  void release();  // under the registry's lock
  c10::SmallVector<c10::Storage, 2> storages_;  // an op pins one or two: no allocation
};

}  // namespace ringreduce

// An array of n values on the stack up to N of them, on the heap beyond: per-rank pointers of a
// reduction, which a node's usual rank count keeps on the stack (an allocation per call was a
// tenth of a small all-reduce's own instructions).
#pragma once

#include <cstddef>
#include <vector>

namespace ringreduce {

template <class T, size_t N = 16>
class SmallArray {
 public:
  explicit SmallArray(size_t n) : data_(stack_) {
    if (n > N) {
      heap_.resize(n);
      data_ = heap_.data();
    }
  }
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;

  T* data() { return data_; }
  T& operator[](size_t i) { return data_[i]; }

 private:
  T stack_[N];
  std::vector<T> heap_;
  T* data_;
};

}  // namespace ringreduce

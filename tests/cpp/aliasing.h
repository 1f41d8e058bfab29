// How a kernel test lays out a binary op's buffers: the destination apart from both inputs, or
// one of them, or the inputs one buffer. Shared by the CPU and CUDA kernel tests.
#pragma once

namespace rrtest {

enum class Alias { None, DstIsA, DstIsB, SameInputs, AllSame };
constexpr Alias kAliases[] = {Alias::None, Alias::DstIsA, Alias::DstIsB, Alias::SameInputs,
                              Alias::AllSame};

inline const char* alias_name(Alias m) {
  switch (m) {
    case Alias::None: return "distinct";
    case Alias::DstIsA: return "dst==a";
    case Alias::DstIsB: return "dst==b";
    case Alias::SameInputs: return "a==b";
    case Alias::AllSame: return "dst==a==b";
  }
  return "?";
}

}  // namespace rrtest

#include "common/algos.h"

#include "common/error.h"

namespace ringreduce {

const std::vector<AlgoInfo>& algorithm_list() {
  static const std::vector<AlgoInfo> list = {
#define RINGREDUCE_ALGO_ROW(tag, name, serves, what) {Algo::tag, name, serves, what},
      RINGREDUCE_ALGORITHMS(RINGREDUCE_ALGO_ROW)
#undef RINGREDUCE_ALGO_ROW
  };
  return list;
}

const char* algo_name(Algo a) {
  for (const AlgoInfo& i : algorithm_list()) {
    if (i.algo == a) return i.name;
  }
  return "unknown";
}

Algo parse_algo(const std::string& text, const char* what) {
  std::string names;
  const auto& list = algorithm_list();
  for (size_t k = 0; k < list.size(); ++k) {
    if (text == list[k].name) return list[k].algo;
    names += detail::cat(k == 0 ? "" : k + 1 == list.size() ? " or " : ", ", list[k].name);
  }
  throw Error(detail::cat("ringreduce: ", what, "=", text, " is not an algorithm (use ", names, ")"));
}

}  // namespace ringreduce

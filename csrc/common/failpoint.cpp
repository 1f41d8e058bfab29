#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ringreduce {

namespace {

struct Spec {
  bool armed = false;
  std::string name;
  int rank = -1;
  long nth = 1;
};

Spec read_spec() {
  Spec s;
  const char* v = std::getenv("RINGREDUCE_FAILPOINT");
  if (v == nullptr || *v == '\0') return s;
  const std::string text = v;
  const size_t a = text.find(':');
  if (a == std::string::npos) return s;
  const size_t b = text.find(':', a + 1);
  s.name = text.substr(0, a);
  s.rank = std::atoi(text.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1).c_str());
  if (b != std::string::npos) s.nth = std::atol(text.c_str() + b + 1);
  s.armed = !s.name.empty() && s.nth >= 1;
  return s;
}

const Spec& spec() {
  static const Spec s = read_spec();
  return s;
}

}  // namespace

void failpoint(const char* name, int rank) {
  const Spec& s = spec();
  if (!s.armed || rank != s.rank || s.name != name) return;
  static std::atomic<long> hits{0};
  if (hits.fetch_add(1) + 1 == s.nth) ::kill(::getpid(), SIGKILL);
}

}  // namespace ringreduce

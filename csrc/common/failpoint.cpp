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
  bool stop = false;  // SIGSTOP instead of SIGKILL
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
  if (b != std::string::npos) {
    const size_t c = text.find(':', b + 1);
    s.nth = std::atol(text.substr(b + 1, c == std::string::npos ? std::string::npos : c - b - 1).c_str());
    if (c != std::string::npos) {
      if (text.substr(c + 1) != "stop") return s;  // an unknown action arms nothing
      s.stop = true;
    }
  }
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
  if (hits.fetch_add(1) + 1 == s.nth) ::kill(::getpid(), s.stop ? SIGSTOP : SIGKILL);
}

}  // namespace ringreduce

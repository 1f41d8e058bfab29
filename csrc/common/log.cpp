#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ringreduce::log {

namespace {

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

Level parse() {
  const char* v = std::getenv("RINGREDUCE_DEBUG");
  if (v == nullptr || *v == '\0') return Level::Off;
  std::string s;
  for (const char* p = v; *p; ++p) s += static_cast<char>(std::toupper(static_cast<unsigned char>(*p)));
  if (s == "WARN") return Level::Warn;
  if (s == "INFO") return Level::Info;
  if (s == "TRACE") return Level::Trace;
  if (s == "OFF" || s == "0") return Level::Off;
  std::fprintf(stderr, "ringreduce: RINGREDUCE_DEBUG=%s is not WARN, INFO or TRACE; using WARN\n", v);
  return Level::Warn;
}

// RINGREDUCE_DEBUG_FILE with %h and %p replaced; stderr when unset or when it cannot be opened.
FILE* open_sink() {
  const char* pattern = std::getenv("RINGREDUCE_DEBUG_FILE");
  if (pattern == nullptr || *pattern == '\0') return stderr;
  std::string path;
  for (const char* p = pattern; *p; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      path += host_name();
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      path += std::to_string(getpid());
      ++p;
    } else {
      path += *p;
    }
  }
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    std::fprintf(stderr, "ringreduce: cannot open RINGREDUCE_DEBUG_FILE %s; writing to stderr\n",
                 path.c_str());
    return stderr;
  }
  return f;
}

}  // namespace

Level level() {
  static const Level l = parse();
  return l;
}

namespace {

void emit(const char* name, int rank, const std::string& message) {
  static std::mutex mu;
  static FILE* sink = open_sink();
  static const std::string host = host_name();
  const std::string rank_part = rank >= 0 ? " [" + std::to_string(rank) + "]" : "";
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(sink, "%s:%d:%ld%s RINGREDUCE %s %s\n", host.c_str(), static_cast<int>(getpid()),
               static_cast<long>(syscall(SYS_gettid)), rank_part.c_str(), name, message.c_str());
  std::fflush(sink);
}

}  // namespace

void write(Level l, int rank, const std::string& message) {
  emit(l == Level::Warn ? "WARN" : l == Level::Info ? "INFO" : "TRACE", rank, message);
}

void note(int rank, const std::string& message) { emit("NOTE", rank, message); }

}  // namespace ringreduce::log

#include "backend/flight_recorder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"

namespace ringreduce {

namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

// mkdir -p, for the dump directory.
void make_dirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      const std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
        RR_SYSCHECK(false, "ringreduce flight recorder: cannot create the directory ", part);
      }
    }
  }
}

// "[4, 1024] [7]" from dims ended by -1 each; at most 4 tensors shown.
std::string shapes_text(const std::vector<int64_t>& dims) {
  std::string out;
  size_t tensors = 0;
  bool open = false;
  for (int64_t d : dims) {
    if (d < 0) {
      if (tensors < 4) out += open ? "]" : (tensors ? " []" : "[]");
      ++tensors;
      open = false;
      continue;
    }
    if (tensors >= 4) continue;
    if (!open) {
      out += tensors ? " [" : "[";
      open = true;
      out += std::to_string(d);
    } else {
      out += ", " + std::to_string(d);
    }
  }
  if (tensors > 4) out += detail::cat(" and ", tensors - 4, " more");
  return out;
}

}  // namespace

const char* flight_state_name(FlightRecorder::State s) {
  switch (s) {
    case FlightRecorder::State::Issued: return "issued";
    case FlightRecorder::State::Running: return "running";
    case FlightRecorder::State::Completed: return "completed";
    case FlightRecorder::State::Failed: return "failed";
  }
  return "unknown";
}

std::string FlightRecorder::default_dir() {
  if (const char* d = std::getenv("RINGREDUCE_FLIGHT_DIR"); d != nullptr && *d != '\0') return d;
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ringreduce-flight";
}

FlightRecorder::FlightRecorder(FlightMeta meta, size_t capacity)
    : meta_(std::move(meta)), entries_(capacity) {}

FlightRecorder::Entry* FlightRecorder::find(uint64_t seq) {
  if (entries_.empty()) return nullptr;
  Entry& e = entries_[seq % entries_.size()];
  return e.used && e.seq == seq ? &e : nullptr;
}

void FlightRecorder::record_issue(uint64_t seq, const char* op, const int64_t* dims, size_t ndims,
                                  const char* dtype, Clock::time_point at) {
  ++issued_count_;
  if (entries_.empty()) return;
  Entry& e = entries_[seq % entries_.size()];
  e.seq = seq;
  e.used = true;
  e.op = op;
  e.dims.assign(dims, dims + ndims);
  e.dtype = dtype;
  e.state = State::Issued;
  e.issued = at;
  e.started = {};
  e.ended = {};
  e.error.clear();
}

void FlightRecorder::issued(uint64_t seq, const char* op, const int64_t* dims, size_t ndims,
                            const char* dtype, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  record_issue(seq, op, dims, ndims, dtype, at);
}

void FlightRecorder::issued_running(uint64_t seq, const char* op, const int64_t* dims, size_t ndims,
                                    const char* dtype, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  record_issue(seq, op, dims, ndims, dtype, at);
  if (Entry* e = find(seq)) {
    e->state = State::Running;
    e->started = at;
  }
}

void FlightRecorder::started(uint64_t seq, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(seq)) {
    e->state = State::Running;
    e->started = at;
  }
}

void FlightRecorder::finished(uint64_t seq, const std::string& error, Clock::time_point at) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(seq)) {
    e->state = error.empty() ? State::Completed : State::Failed;
    e->ended = at;
    e->error = error;
  }
}

std::string FlightRecorder::to_json(const std::string& reason) const {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string out = "{\n  \"format\": \"ringreduce-flight-1\",\n  \"group\": ";
  json_string(out, meta_.group_uid);
  out += detail::cat(",\n  \"rank\": ", meta_.rank, ",\n  \"world_size\": ", meta_.size,
                     ",\n  \"pid\": ", getpid(), ",\n  \"host\": ");
  json_string(out, host);
  out += ",\n  \"transport\": ";
  json_string(out, meta_.transport);
  out += ",\n  \"reason\": ";
  json_string(out, reason);
  // Under the lock, so that no op recorded after these readings is dumped. The entries' steady
  // times become wall-clock time through both clocks read here: a wall clock stepped since an op
  // shows it shifted by the step, where the steady clock (its deadline's) had it.
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t dumped_us = now_us();
  const Clock::time_point steady_now = Clock::now();
  out += detail::cat(",\n  \"dumped_us\": ", dumped_us);
  auto wall_us = [&](Clock::time_point t) -> int64_t {
    if (t == Clock::time_point{}) return 0;
    return dumped_us - std::chrono::duration_cast<std::chrono::microseconds>(steady_now - t).count();
  };
  out += detail::cat(",\n  \"capacity\": ", entries_.size(), ",\n  \"ops_issued\": ", issued_count_,
                     ",\n  \"ops\": [");
  // Oldest first: the kept window is the last `capacity` sequence numbers.
  const uint64_t n = entries_.size();
  const uint64_t first = issued_count_ > n ? issued_count_ - n : 0;
  bool any = false;
  for (uint64_t s = first; s < issued_count_; ++s) {
    const Entry& e = entries_[s % n];
    if (!e.used || e.seq != s) continue;
    out += any ? ",\n    {" : "\n    {";
    any = true;
    out += detail::cat("\"seq\": ", e.seq, ", \"op\": ");
    json_string(out, e.op);
    out += ", \"shapes\": ";
    json_string(out, shapes_text(e.dims));
    out += ", \"dtype\": ";
    json_string(out, e.dtype);
    out += ", \"state\": ";
    json_string(out, flight_state_name(e.state));
    out += detail::cat(", \"issued_us\": ", wall_us(e.issued), ", \"started_us\": ",
                       wall_us(e.started), ", \"ended_us\": ", wall_us(e.ended));
    if (!e.error.empty()) {
      out += ", \"error\": ";
      json_string(out, e.error);
    }
    out += "}";
  }
  out += any ? "\n  ]\n}\n" : "]\n}\n";
  return out;
}

std::string FlightRecorder::dump(const std::string& dir, const std::string& reason) const {
  const std::string text = to_json(reason);
  make_dirs(dir);
  const std::string path =
      detail::cat(dir, "/ringreduce_flight_", meta_.group_uid, "_rank", meta_.rank, ".json");
  const std::string tmp = detail::cat(path, ".tmp", getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  RR_SYSCHECK(f != nullptr, "ringreduce flight recorder: cannot write ", tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    errno = err;
    RR_SYSCHECK(false, "ringreduce flight recorder: cannot write ", path);
  }
  return path;
}

void FlightRecorder::withdraw(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(seq)) e->used = false;
  --issued_count_;
}

std::string FlightRecorder::dump_once(const std::string& dir, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (dumped_) return "";
    dumped_ = true;
  }
  return dump(dir, reason);
}

}  // namespace ringreduce

#include "common/flight_recorder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

// "[4, 1024] [7]" from the shown tensors' dims (each ended by -1), and how many more there are.
std::string shapes_text(const std::vector<int64_t>& dims, uint64_t tensors) {
  std::string out;
  uint64_t shown = 0;
  bool open = false;
  for (int64_t d : dims) {
    if (d < 0) {
      out += open ? "]" : (shown ? " []" : "[]");
      ++shown;
      open = false;
      continue;
    }
    if (!open) {
      out += shown ? " [" : "[";
      open = true;
      out += std::to_string(d);
    } else {
      out += ", " + std::to_string(d);
    }
  }
  if (tensors > shown) out += detail::cat(" and ", tensors - shown, " more");
  return out;
}

int64_t steady_ns(FlightRecorder::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// How many values the shown shapes take in a slot: each shape and its -1.
size_t flat_size(const FlightRecorder::Shapes& sh) {
  size_t n = sh.shown;
  for (size_t i = 0; i < sh.shown; ++i) n += sh.ndim[i];
  return n;
}

// A slot's one writer brackets its writes: the version is odd while they are under way. The
// writes between are release stores and a reader's loads acquire loads, so that a reader that sees
// any of them sees the odd version too when it reads the version again (a seqlock without fences,
// which ThreadSanitizer does not model; on x86 all of these are plain moves).
void open_slot(std::atomic<uint32_t>& version) {
  version.store(version.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
void close_slot(std::atomic<uint32_t>& version) {
  version.store(version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
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
    : meta_(std::move(meta)),
      capacity_(capacity),
      slots_(capacity != 0 ? std::make_unique<Slot[]>(capacity) : nullptr) {}

namespace {

bool has_ended(uint8_t state, uint8_t free) {
  return state == free || state == static_cast<uint8_t>(FlightRecorder::State::Completed) ||
         state == static_cast<uint8_t>(FlightRecorder::State::Failed);
}

}  // namespace

void FlightRecorder::record_issue(uint64_t seq, const char* op, const Shapes& shapes,
                                  const char* dtype, Clock::time_point at, bool running) noexcept {
  issued_count_.store(issued_count_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  if (capacity_ == 0) return;
  const size_t shown = flat_size(shapes);
  const uint64_t tensors = shapes.tensors;
  const int64_t t = steady_ns(at);
  const State state = running ? State::Running : State::Issued;
  Slot& s = slot_of(seq);
  // The slot is this op's if its last op has ended (its writer is done with it). Read as a dump
  // reads it: a state seen while its writer was under way does not count.
  const uint32_t v = s.version.load(std::memory_order_acquire);
  const uint8_t last = s.state.load(std::memory_order_acquire);
  const bool free = (v & 1) == 0 && s.version.load(std::memory_order_relaxed) == v &&
                    has_ended(last, kFree);
  if (free && shown <= kSlotDims) {
    open_slot(s.version);
    s.seq.store(seq, std::memory_order_release);
    s.op.store(op, std::memory_order_release);
    s.dtype.store(dtype, std::memory_order_release);
    s.tensors.store(tensors, std::memory_order_release);
    s.ndims.store(static_cast<uint8_t>(shown), std::memory_order_release);
    size_t k = 0;
    for (size_t i = 0; i < shapes.shown; ++i) {
      for (size_t j = 0; j < shapes.ndim[i]; ++j) s.dims[k++].store(shapes.dims[i][j], std::memory_order_release);
      s.dims[k++].store(-1, std::memory_order_release);
    }
    s.issued.store(t, std::memory_order_release);
    s.started.store(running ? t : 0, std::memory_order_release);
    s.ended.store(0, std::memory_order_release);
    s.state.store(static_cast<uint8_t>(state), std::memory_order_release);
    close_slot(s.version);
    return;
  }
  try {
    Record r;
    r.seq = seq;
    r.op = op;
    r.dtype = dtype;
    r.state = state;
    r.dims.reserve(shown);
    for (size_t i = 0; i < shapes.shown; ++i) {
      r.dims.insert(r.dims.end(), shapes.dims[i], shapes.dims[i] + shapes.ndim[i]);
      r.dims.push_back(-1);
    }
    r.tensors = tensors;
    r.issued = t;
    r.started = running ? t : 0;
    std::lock_guard<std::mutex> lock(side_mu_);
    prune_side(seq);
    side_[seq] = std::move(r);
  } catch (...) {
    // No memory for the record: the op goes unrecorded rather than failing.
  }
}

void FlightRecorder::prune_side(uint64_t newest) {
  for (auto it = side_.begin(); it != side_.end();) {
    const bool old = it->first + capacity_ <= newest;
    const bool ended = it->second.state == State::Completed || it->second.state == State::Failed;
    it = old && ended ? side_.erase(it) : std::next(it);
  }
  // Room for one more: errors are few (a group rarely outlives its first).
  while (!errors_.empty() && errors_.size() >= capacity_) errors_.erase(errors_.begin());
}

void FlightRecorder::issued(uint64_t seq, const char* op, const Shapes& shapes, const char* dtype,
                            Clock::time_point at) noexcept {
  record_issue(seq, op, shapes, dtype, at, false);
}

void FlightRecorder::issued_running(uint64_t seq, const char* op, const Shapes& shapes,
                                    const char* dtype, Clock::time_point at) noexcept {
  record_issue(seq, op, shapes, dtype, at, true);
}

FlightRecorder::Slot* FlightRecorder::own_slot(uint64_t seq) const {
  if (capacity_ == 0) return nullptr;
  Slot& s = slot_of(seq);
  // Only the op's own issue writes `seq` into its slot; a slot holding another op (or being
  // rewritten for one) never reads as this op's.
  if (s.seq.load(std::memory_order_acquire) != seq || s.state.load(std::memory_order_acquire) == kFree) {
    return nullptr;
  }
  return &s;
}

void FlightRecorder::withdraw(uint64_t seq) noexcept {
  issued_count_.store(issued_count_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  if (Slot* s = own_slot(seq)) {
    open_slot(s->version);
    // No sequence number either: the number is issued again, and that op may go to the side
    // table while a later op takes this slot; its runner, reading this slot's number and state
    // while that later op's issue writes them, must never see its own number here.
    s->seq.store(kNoSeq, std::memory_order_release);
    s->state.store(kFree, std::memory_order_release);
    close_slot(s->version);
    return;
  }
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(side_mu_);
  side_.erase(seq);
}

void FlightRecorder::started(uint64_t seq, Clock::time_point at) noexcept {
  if (Slot* s = own_slot(seq)) {
    open_slot(s->version);
    s->started.store(steady_ns(at), std::memory_order_release);
    s->state.store(static_cast<uint8_t>(State::Running), std::memory_order_release);
    close_slot(s->version);
    return;
  }
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(side_mu_);
  if (auto it = side_.find(seq); it != side_.end()) {
    it->second.state = State::Running;
    it->second.started = steady_ns(at);
  }
}

void FlightRecorder::finished(uint64_t seq, const std::string& error, Clock::time_point at) noexcept {
  if (capacity_ == 0) return;
  const State state = error.empty() ? State::Completed : State::Failed;
  Slot* s = own_slot(seq);
  if (s == nullptr || !error.empty()) {
    std::lock_guard<std::mutex> lock(side_mu_);
    try {
      // Stored before the slot says Failed, so that a dump that reads the state finds the text.
      if (!error.empty()) {
        prune_side(seq);
        errors_[seq] = error;
      }
      if (s == nullptr) {
        if (auto it = side_.find(seq); it != side_.end()) {
          it->second.state = state;
          it->second.ended = steady_ns(at);
          it->second.error = error;
        }
        return;
      }
    } catch (...) {
      // No memory for the error's text: the op still shows as failed.
    }
  }
  if (s == nullptr) return;
  open_slot(s->version);
  s->ended.store(steady_ns(at), std::memory_order_release);
  s->state.store(static_cast<uint8_t>(state), std::memory_order_release);
  close_slot(s->version);
}

bool FlightRecorder::read(const Slot& s, Record& r) const {
  int64_t dims[kSlotDims];
  for (int attempt = 0;; ++attempt) {
    const uint32_t v = s.version.load(std::memory_order_acquire);
    if ((v & 1) == 0) {
      const uint8_t state = s.state.load(std::memory_order_acquire);
      const size_t n = std::min<size_t>(s.ndims.load(std::memory_order_acquire), kSlotDims);
      for (size_t i = 0; i < n; ++i) dims[i] = s.dims[i].load(std::memory_order_acquire);
      r.seq = s.seq.load(std::memory_order_acquire);
      r.op = s.op.load(std::memory_order_acquire);
      r.dtype = s.dtype.load(std::memory_order_acquire);
      r.tensors = s.tensors.load(std::memory_order_acquire);
      r.issued = s.issued.load(std::memory_order_acquire);
      r.started = s.started.load(std::memory_order_acquire);
      r.ended = s.ended.load(std::memory_order_acquire);
      if (s.version.load(std::memory_order_relaxed) == v) {
        if (state == kFree) return false;
        r.state = static_cast<State>(state);
        r.dims.assign(dims, dims + n);
        return true;
      }
    }
    // Its writer is under way (a few stores): read again. One stopped in the middle for longer
    // than this leaves the op out of this dump.
    if (attempt >= 100000) return false;
    std::this_thread::yield();
  }
}

std::vector<FlightRecorder::Record> FlightRecorder::snapshot() const {
  std::vector<Record> out;
  for (size_t i = 0; i < capacity_; ++i) {
    Record r;
    if (read(slots_[i], r)) out.push_back(std::move(r));
  }
  {
    std::lock_guard<std::mutex> lock(side_mu_);
    for (Record& r : out) {
      if (r.state != State::Failed) continue;
      auto it = errors_.find(r.seq);
      r.error = it != errors_.end() ? it->second : "(the error's text was not kept)";
    }
    for (const auto& [seq, r] : side_) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.seq < b.seq; });
  // The window is the last `capacity` ops, and any older one still in flight (which kept its slot,
  // or is in the side table until the next op that goes there prunes it).
  if (!out.empty()) {
    const uint64_t newest = out.back().seq;
    out.erase(std::remove_if(out.begin(), out.end(),
                             [&](const Record& r) {
                               return r.seq + capacity_ <= newest &&
                                      (r.state == State::Completed || r.state == State::Failed);
                             }),
              out.end());
  }
  return out;
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
  // The entries' steady times become wall-clock time through both clocks read here: a wall clock
  // stepped since an op shows it shifted by the step, where the steady clock (its deadline's) had
  // it. Ops issued after these readings are left out, as a dump under a lock would have them.
  const int64_t dumped_us = now_us();
  const Clock::time_point steady_now = Clock::now();
  const uint64_t issued = issued_count_.load(std::memory_order_acquire);
  const std::vector<Record> records = snapshot();
  out += detail::cat(",\n  \"dumped_us\": ", dumped_us);
  const int64_t now_ns = steady_ns(steady_now);
  auto wall_us = [&](int64_t t) -> int64_t {
    if (t == 0) return 0;
    return dumped_us - (now_ns - t) / 1000;
  };
  out += detail::cat(",\n  \"capacity\": ", capacity_, ",\n  \"ops_issued\": ", issued,
                     ",\n  \"ops\": [");
  bool any = false;
  for (const Record& e : records) {
    if (e.issued > now_ns) continue;
    out += any ? ",\n    {" : "\n    {";
    any = true;
    out += detail::cat("\"seq\": ", e.seq, ", \"op\": ");
    json_string(out, e.op);
    out += ", \"shapes\": ";
    json_string(out, shapes_text(e.dims, e.tensors));
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

std::string FlightRecorder::dump_once(const std::string& dir, const std::string& reason) {
  if (dumped_.exchange(true, std::memory_order_acq_rel)) return "";
  return dump(dir, reason);
}

}  // namespace ringreduce

#include "algo/handoff.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"
#include "common/log.h"

namespace ringreduce {

namespace {

std::string kib(size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  } else {
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  }
  return buf;
}

}  // namespace

const char* SlotWrites::name(Mode m) {
  switch (m) {
    case Mode::Auto: return "auto";
    case Mode::Plain: return "plain";
    case Mode::Stream: return "stream";
  }
  return "?";
}

SlotWrites::Mode SlotWrites::parse(const std::string& text, const char* what) {
  for (Mode m : {Mode::Auto, Mode::Plain, Mode::Stream}) {
    if (text == name(m)) return m;
  }
  throw Error(detail::cat("ringreduce: ", what, "=", text, " must be auto, plain or stream"));
}

void SlotWrites::configure(Mode mode, size_t min_bytes, int rank) {
  mode_ = mode;
  min_bytes_ = min_bytes;
  rank_ = rank;
  classes_ = {};
  // Ops per batch in each group, from the smallest op the group holds.
  for (int c = 0; c < kClasses; ++c) {
    const size_t low = std::max<size_t>(min_bytes_, 1) << c;
    classes_[c].batch = std::clamp<uint64_t>(kBatchBytes / low, 1, kMaxBatch);
  }
}

std::string SlotWrites::describe() const {
  switch (mode_) {
    case Mode::Plain: return "plain";
    case Mode::Stream:
      return min_bytes_ ? detail::cat("streamed from ", kib(min_bytes_)) : std::string("streamed");
    case Mode::Auto:
      return detail::cat("plain or streamed, measured, from ", kib(min_bytes_));
  }
  return "?";
}

int SlotWrites::class_of(size_t bytes) const {
  int c = 0;
  for (size_t b = std::max<size_t>(min_bytes_, 1) * 2; b <= bytes && c < kClasses - 1; b *= 2) ++c;
  return c;
}

double SlotWrites::best(const std::array<double, kSamples>& s) {
  double m = 0;
  for (double v : s) {
    if (v > 0 && (m == 0 || v < m)) m = v;
  }
  return m;
}

bool SlotWrites::should_stream(const Class& c) const {
  const double plain = best(c.per_byte[0]), streamed = best(c.per_byte[1]);
  if (plain == 0 || streamed == 0) return plain == 0 && streamed != 0;
  return streamed <= (c.best_streamed ? kPlainBack : kStreamWins) * plain;
}

bool SlotWrites::stream(size_t bytes, bool timed) {
  if (mode_ == Mode::Plain || bytes == 0 || bytes < min_bytes_) return false;
  if (mode_ == Mode::Stream) return true;
  Class& c = classes_[class_of(bytes)];
  if (!timed) return c.best_streamed;
  // The same schedule on every rank (it counts ops, which every rank runs alike), so the ops
  // that explore are the same ops everywhere.
  const uint64_t k = c.ops++ / c.batch;
  if (k < kWarmup) return k % 2 == 1;
  const bool other = k % kExploreEvery == kExploreEvery - 1;
  return other ? !c.best_streamed : c.best_streamed;
}

void SlotWrites::done(size_t bytes, bool streamed, double seconds) {
  if (mode_ != Mode::Auto || bytes == 0 || bytes < min_bytes_ || seconds <= 0) return;
  Class& c = classes_[class_of(bytes)];
  const int way = streamed ? 1 : 0;
  c.batch_seconds[way] += seconds;
  c.batch_bytes[way] += static_cast<double>(bytes);
  if (++c.batch_ops[way] < c.batch) return;
  c.per_byte[way][c.next[way]++ % kSamples] = c.batch_seconds[way] / c.batch_bytes[way];
  c.batch_seconds[way] = 0;
  c.batch_bytes[way] = 0;
  c.batch_ops[way] = 0;
  const bool was = c.best_streamed;
  c.best_streamed = should_stream(c);
  if (c.best_streamed != was && c.ops > kWarmup * c.batch && log::enabled(log::Level::Info)) {
    const double plain = best(c.per_byte[0]), stream = best(c.per_byte[1]);
    log::write(log::Level::Info, rank_,
               detail::cat("ops of about ", kib(bytes), " now write their slots ",
                           c.best_streamed ? "streamed" : "plainly", ": ",
                           plain > 0 ? 1e-9 / plain : 0.0, " GB/s plain, ",
                           stream > 0 ? 1e-9 / stream : 0.0, " GB/s streamed, recently"));
  }
}

}  // namespace ringreduce

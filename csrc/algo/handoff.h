// How a ring op writes the slots that a peer reads next: with plain stores, or with non-temporal
// ("streaming") stores that go around the writer's cache.
//
// Why it is a choice made at run time. A slot written with plain stores is read out of the
// writer's cache. Where the two cores share a last-level cache that is the fastest hand-off there
// is; where they do not (two chiplets, two sockets, or a VM whose virtual CPUs the host moves
// between them) every line is fetched from the other core's cache across the fabric, and on the
// development machines that made 64 MiB all-reduces 5x slower (1.5 against 8 GB/s) in some
// launches and not in others. Streamed, a slot is read from memory, at about the same speed in
// both placements, but 10-30% slower than a shared cache. Which placement a process has cannot
// be read from inside a VM, and it can change while the job runs, so each group measures: its
// large ops try both ways at first and then now and then, and stream where that is clearly the
// faster (docs/design.md, "Hand-offs between cores", has the measurements).
//
// The choice never changes a result (the bytes written are the same either way) nor what ranks
// send each other, so ranks may choose differently without harm; they usually agree, since they
// time the same ops.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ringreduce {

class SlotWrites {
 public:
  enum class Mode { Auto, Plain, Stream };
  // Ops of fewer than `min_bytes` (0: every op) always write plainly: their slots stay in cache
  // for the reader, and one op is too short to time well.
  void configure(Mode mode, size_t min_bytes, int rank);

  // Whether the op about to start, of `bytes` in all, streams its slot writes. `timed`: the op
  // will report its time to done() (the all-reduce, which the choice is made for); the other ops
  // follow the all-reduce's current choice for their size.
  bool stream(size_t bytes, bool timed);
  // Whether done() learns from an op of `bytes`: callers read the clock for it only then (below
  // the smallest size that may stream, every op writes plainly and its time is not wanted).
  bool learns(size_t bytes) const { return mode_ == Mode::Auto && bytes != 0 && bytes >= min_bytes_; }
  // The time of a timed op that stream() answered `streamed` for.
  void done(size_t bytes, bool streamed, double seconds);

  // "auto (plain below 256 KiB)", "always", ...: for the INFO line.
  std::string describe() const;
  static Mode parse(const std::string& text, const char* what);
  static const char* name(Mode m);

 private:
  // Ops are grouped by size in powers of two from min_bytes; each group keeps the last few
  // seconds-per-byte of each way and runs its ops the way whose best recent figure is lower.
  // From the default 4 KiB the groups reach 64 MiB, so a large op and one that fits in cache never
  // share one.
  static constexpr int kClasses = 16;
  static constexpr int kSamples = 4;
  // A group's ops run in batches, each batch one way and timed as a whole (its ops' seconds over
  // its bytes): one op of kBatchBytes or more per batch, and for smaller ops as many as make
  // kBatchBytes (at most kMaxBatch). One small op is too short to judge by: its time is mostly
  // how late its peers came, and single 8 KiB ops made the two ways flip back and forth and
  // the ranks disagree. The first kWarmup batches of a group alternate; after that one batch in
  // kExploreEvery runs the other way, so a change of placement is noticed within that many.
  static constexpr uint64_t kWarmup = 4;
  // A group streams once streamed writes take kStreamWins of plain ones' time or less, and
  // writes plainly again once they take more than kPlainBack. Plain writes leave the slots in a
  // cache the reader may share, and where the two cores share none both ways are slow (at
  // 1 MiB, two ranks on two chiplets took about 200 us plain and 180 streamed, against 50 plain
  // on one): a small or noisy lead for streaming made ranks switch, back and forth and each on
  // its own, for no gain.
  static constexpr double kStreamWins = 0.8;
  static constexpr double kPlainBack = 0.9;
  static constexpr uint64_t kExploreEvery = 32;
  static constexpr size_t kBatchBytes = 64 << 10;
  static constexpr uint64_t kMaxBatch = 16;
  struct Class {
    uint64_t ops = 0;
    std::array<std::array<double, kSamples>, 2> per_byte{};  // [streamed][i]; 0: no sample
    std::array<uint32_t, 2> next{};
    bool best_streamed = false;
    uint64_t batch = 1;  // ops per batch (set by configure)
    // The batch being timed, per way: its seconds, bytes and ops so far.
    std::array<double, 2> batch_seconds{};
    std::array<double, 2> batch_bytes{};
    std::array<uint64_t, 2> batch_ops{};
  };
  int class_of(size_t bytes) const;
  static double best(const std::array<double, kSamples>& s);
  // Whether the group streams, from its recent figures and its current way (kStreamWins, kPlainBack).
  bool should_stream(const Class& c) const;

  Mode mode_ = Mode::Plain;
  size_t min_bytes_ = 0;
  int rank_ = -1;
  std::array<Class, kClasses> classes_{};
};

}  // namespace ringreduce

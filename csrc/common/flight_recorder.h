// The flight recorder: the last N collectives of one group on this rank, with what each was
// (sequence number, op, tensor shapes, dtype), how far it got (issued, running, completed,
// failed, with the error) and when. It is dumped to a JSON file per rank when an op of the group
// first fails (a timeout here, or an abort or dead peer elsewhere) and on request
// (ringreduce.dump_flight_recorder); `python -m ringreduce.flight DIR` reads the dumps of every
// rank and says which rank is missing which op, or where the ranks' ops differ.
//
// Recording an op takes no lock, no atomic read-modify-write and no allocation: every small op
// records its issue, start and end, and a lock per event was a tenth of ringreduce's own code
// per op. What makes that safe is that each slot (op `seq` keeps slot seq % capacity) has one
// writer at a time, by construction:
// - issue records are serialized by the caller (the backend makes them under the lock that also
//   hands out sequence numbers), and an issue takes a slot only once its last op has ended: an op
//   still in flight `capacity` ops later keeps its slot, and the newer op goes to a side table;
// - an op's start and end are written by whoever runs it, after its issue (the op queue orders
//   the two), and an ended op is never written again.
// A dump reads each slot as a seqlock reader: a slot's version is odd while its writer writes it,
// and a read that overlapped a write is made again. The rare and slow cases (an op that found
// its slot busy or whose shapes do not fit a slot, an op's error text) go to a side table under
// a mutex. Text is made only when dumping.
//
// Times are taken on the steady clock that ops' deadlines use, so that an op run at its call
// reads the clock once for its issue, its start and its deadline (RingBackend::allreduce_inline),
// and are turned into wall clock time (comparable across hosts) when dumped.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ringreduce {

struct FlightMeta {
  std::string group_uid;  // the same on every rank of the group (drawn by rank 0)
  int rank = 0;
  int size = 0;
  std::string transport;  // "shm", "tcp" or "mixed": how this rank reaches its peers
};

class FlightRecorder {
 public:
  enum class State : uint8_t { Issued, Running, Completed, Failed };
  using Clock = std::chrono::steady_clock;

  // `capacity` ops are kept (0: nothing is recorded and dumps hold no ops).
  FlightRecorder(FlightMeta meta, size_t capacity);

  size_t capacity() const { return capacity_; }
  const FlightMeta& meta() const { return meta_; }

  // Where dumps go unless the caller names a directory: RINGREDUCE_FLIGHT_DIR, else
  // $TMPDIR/ringreduce-flight (/tmp/ringreduce-flight without TMPDIR). The one definition:
  // ringreduce.flight asks for it (ringreduce._C.default_flight_dir()) to find the dumps.
  static std::string default_dir();

  // A slot holds the shapes of an op's first kShown tensors (all a dump shows) in kSlotDims values
  // (each shape ended by -1); an op whose shapes need more is kept in the side table.
  static constexpr size_t kShown = 4;
  static constexpr size_t kSlotDims = 24;

  // An op's tensors' shapes as the recorder takes them: the first kShown, by pointer (read during
  // the call only, so the caller builds this from its tensors with no copy), and how many
  // tensors the op has.
  struct Shapes {
    const int64_t* dims[kShown] = {};
    size_t ndim[kShown] = {};
    size_t shown = 0;
    uint64_t tensors = 0;
  };

  // An op got sequence number `seq` (numbers are issued in order, one per collective); `op` and
  // `dtype` are static strings. The caller serializes issued(), issued_running() and withdraw()
  // (see the file comment). Never throws: an op whose record cannot be kept (no memory for the
  // side table) goes unrecorded rather than failing.
  void issued(uint64_t seq, const char* op, const Shapes& shapes, const char* dtype,
              Clock::time_point at) noexcept;
  // issued() and started() at once, for an op that starts where it is issued.
  void issued_running(uint64_t seq, const char* op, const Shapes& shapes, const char* dtype,
                      Clock::time_point at) noexcept;
  // The op numbered `seq`, the last issued, was not queued after all (its number is reused).
  void withdraw(uint64_t seq) noexcept;
  // Called by whoever runs op `seq`, after its issue was recorded.
  void started(uint64_t seq, Clock::time_point at) noexcept;
  // `error` is empty on success.
  void finished(uint64_t seq, const std::string& error, Clock::time_point at) noexcept;

  // The whole record as JSON, with why it was dumped. Ops issued after the dump's clock readings
  // are left out.
  std::string to_json(const std::string& reason) const;
  // Writes to_json() to `dir`/ringreduce_flight_<group_uid>_rank<rank>.json (creating `dir`),
  // through a temporary file renamed into place so a reader never sees half a dump. Returns the
  // path. Throws ringreduce::Error naming the path when it cannot be written.
  std::string dump(const std::string& dir, const std::string& reason) const;
  // dump() the first time only (for the first failure of the group; later ones repeat it).
  // Returns the path, or "" when it had already been dumped.
  std::string dump_once(const std::string& dir, const std::string& reason);
  bool dumped() const { return dumped_.load(std::memory_order_acquire); }

  // One op as a dump sees it.
  struct Record {
    uint64_t seq = 0;
    const char* op = "";
    const char* dtype = "";
    State state = State::Issued;
    std::vector<int64_t> dims;  // the first kShown tensors' shapes, each ended by -1
    uint64_t tensors = 0;       // how many tensors the op has
    int64_t issued = 0, started = 0, ended = 0;  // steady clock ns; 0: not yet
    std::string error;
  };
  // Every op kept, oldest first (what to_json() writes), read without stopping the writers.
  std::vector<Record> snapshot() const;

 private:
  // Slot states; kFree: never used, or its op was withdrawn.
  static constexpr uint8_t kFree = 0xff;
  static constexpr uint64_t kNoSeq = ~uint64_t{0};  // a withdrawn op's slot
  struct alignas(64) Slot {
    std::atomic<uint32_t> version{0};  // odd while its writer writes it
    std::atomic<uint8_t> state{kFree};
    std::atomic<uint8_t> ndims{0};  // values used in `dims`
    std::atomic<uint64_t> tensors{0};
    std::atomic<uint64_t> seq{0};
    std::atomic<const char*> op{nullptr};
    std::atomic<const char*> dtype{nullptr};
    std::atomic<int64_t> issued{0}, started{0}, ended{0};
    std::atomic<int64_t> dims[kSlotDims];
  };

  Slot& slot_of(uint64_t seq) const { return slots_[seq % capacity_]; }
  // The slot `seq` was recorded in, or null when it went to the side table (or nowhere).
  Slot* own_slot(uint64_t seq) const;
  bool read(const Slot& s, Record& r) const;
  void record_issue(uint64_t seq, const char* op, const Shapes& shapes, const char* dtype,
                    Clock::time_point at, bool running) noexcept;
  // Under side_mu_: forgets ended side-table ops and errors that are out of the kept window.
  void prune_side(uint64_t newest);

  FlightMeta meta_;
  size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> issued_count_{0};  // written by the (serialized) issue records only
  std::atomic<bool> dumped_{false};

  mutable std::mutex side_mu_;
  std::map<uint64_t, Record> side_;          // ops without a slot of their own
  std::map<uint64_t, std::string> errors_;   // failed ops' errors, by sequence number
};

const char* flight_state_name(FlightRecorder::State s);

}  // namespace ringreduce

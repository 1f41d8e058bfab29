// The flight recorder: the last N collectives of one group on this rank, with what each was
// (sequence number, op, tensor shapes, dtype), how far it got (issued, running, completed,
// failed, with the error) and when. It is dumped to a JSON file per rank when an op of the group
// first fails (a timeout here, or an abort or dead peer elsewhere) and on request
// (ringreduce.dump_flight_recorder); `python -m ringreduce.flight DIR` reads the dumps of every
// rank and says which rank is missing which op, or where the ranks' ops differ.
//
// Recording costs an uncontended mutex and a few small copies per event, and no allocation once
// the ring of entries has gone round once; text is made only when dumping. Times are taken on the
// steady clock that ops' deadlines use, so that an op run at its call reads the clock once for
// its issue, its start and its deadline (RingBackend::allreduce_inline), and are turned into wall
// clock time (comparable across hosts) when dumped.
#pragma once

#include <chrono>
#include <cstdint>
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
  enum class State { Issued, Running, Completed, Failed };

  // `capacity` entries are kept (0: nothing is recorded and dumps hold no ops).
  FlightRecorder(FlightMeta meta, size_t capacity);

  size_t capacity() const { return entries_.size(); }
  const FlightMeta& meta() const { return meta_; }

  // Where dumps go unless the caller names a directory: RINGREDUCE_FLIGHT_DIR, else
  // $TMPDIR/ringreduce-flight (/tmp/ringreduce-flight without TMPDIR). The one definition:
  // ringreduce.flight asks for it (ringreduce._C.default_flight_dir()) to find the dumps.
  static std::string default_dir();

  // An op got sequence number `seq` (numbers are issued in order, one per collective). `dims`
  // holds the shapes of its tensors, each ended by -1; `op` and `dtype` are static strings.
  // Copies into storage an earlier op left, so a full recorder allocates nothing.
  using Clock = std::chrono::steady_clock;
  void issued(uint64_t seq, const char* op, const int64_t* dims, size_t ndims, const char* dtype,
              Clock::time_point at);
  // issued() and started() at once, for an op that starts where it is issued.
  void issued_running(uint64_t seq, const char* op, const int64_t* dims, size_t ndims,
                      const char* dtype, Clock::time_point at);
  // The op numbered `seq`, the last issued, was not queued after all (its number is reused).
  void withdraw(uint64_t seq);
  void started(uint64_t seq, Clock::time_point at);
  // `error` is empty on success.
  void finished(uint64_t seq, const std::string& error, Clock::time_point at);

  // The whole record as JSON, with why it was dumped.
  std::string to_json(const std::string& reason) const;
  // Writes to_json() to `dir`/ringreduce_flight_<group_uid>_rank<rank>.json (creating `dir`),
  // through a temporary file renamed into place so a reader never sees half a dump. Returns the
  // path. Throws ringreduce::Error naming the path when it cannot be written.
  std::string dump(const std::string& dir, const std::string& reason) const;
  // dump() the first time only (for the first failure of the group; later ones repeat it).
  // Returns the path, or "" when it had already been dumped.
  std::string dump_once(const std::string& dir, const std::string& reason);
  bool dumped() const {
    std::lock_guard<std::mutex> lock(mu_);
    return dumped_;
  }

 private:
  struct Entry {
    uint64_t seq = 0;
    bool used = false;
    const char* op = "";
    std::vector<int64_t> dims;  // as passed to issued()
    const char* dtype = "";
    State state = State::Issued;
    Clock::time_point issued{};  // dumped as wall clock microseconds since the epoch
    Clock::time_point started{};  // {}: not started
    Clock::time_point ended{};
    std::string error;
  };
  Entry* find(uint64_t seq);
  // Under mu_: entry `seq` takes what issued() records.
  void record_issue(uint64_t seq, const char* op, const int64_t* dims, size_t ndims,
                    const char* dtype, Clock::time_point at);

  FlightMeta meta_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // entry of seq s at s % capacity
  uint64_t issued_count_ = 0;
  bool dumped_ = false;
};

const char* flight_state_name(FlightRecorder::State s);

}  // namespace ringreduce

// The flight recorder (common/flight_recorder.h): what a dump holds, an op that stays in flight
// while its slot comes round again, and a dump taken while ops are being recorded on other
// threads (the recorder takes no lock for an op's records: the ThreadSanitizer build of this test
// is what checks that its readers and writers share nothing unguarded).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "common/flight_recorder.h"
#include "rrtest.h"

using namespace ringreduce;
using State = FlightRecorder::State;
using Clock = FlightRecorder::Clock;

namespace {

Clock::time_point at(int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }

FlightMeta meta() {
  FlightMeta m;
  m.group_uid = "g";
  m.rank = 0;
  m.size = 2;
  m.transport = "shm";
  return m;
}

// What op `seq` of the made-up streams below is: its name, dtype and shape follow from its number,
// so that a record mixing two ops shows.
const char* const kOps[] = {"allreduce", "broadcast", "allgather"};
const char* const kTypes[] = {"Float", "Long", "Half"};
std::vector<int64_t> dims_for(uint64_t seq) {
  return {static_cast<int64_t>(seq % 1000), static_cast<int64_t>(seq % 7), -1};
}
// The recorder's view of tensors of these shapes.
FlightRecorder::Shapes shapes(const std::vector<std::vector<int64_t>>& ts) {
  FlightRecorder::Shapes sh;
  sh.tensors = ts.size();
  for (size_t i = 0; i < ts.size() && i < FlightRecorder::kShown; ++i) {
    sh.dims[i] = ts[i].data();
    sh.ndim[i] = ts[i].size();
    sh.shown = i + 1;
  }
  return sh;
}
void issue(FlightRecorder& f, uint64_t seq, bool running = false) {
  const std::vector<std::vector<int64_t>> t = {{static_cast<int64_t>(seq % 1000), static_cast<int64_t>(seq % 7)}};
  if (running) {
    f.issued_running(seq, kOps[seq % 3], shapes(t), kTypes[seq % 3], at(10 * seq + 1));
  } else {
    f.issued(seq, kOps[seq % 3], shapes(t), kTypes[seq % 3], at(10 * seq + 1));
  }
}
// "" when the record is op `seq` as issue() made it, at least as far as `least` got.
std::string check(const FlightRecorder::Record& r, State least) {
  const uint64_t s = r.seq;
  if (std::string(r.op) != kOps[s % 3] || std::string(r.dtype) != kTypes[s % 3]) return "name or dtype";
  if (r.dims != dims_for(s) || r.tensors != 1) return "shape";
  if (r.issued != static_cast<int64_t>(10 * s + 1)) return "issue time";
  if (static_cast<int>(r.state) < static_cast<int>(least)) return "state behind";
  // (An op issued running started at its issue.)
  if (r.state != State::Issued && r.started != static_cast<int64_t>(10 * s + 2) && r.started != r.issued) {
    return "start time";
  }
  if (r.state >= State::Completed && r.ended != static_cast<int64_t>(10 * s + 3)) return "end time";
  if (r.state == State::Issued && (r.started != 0 || r.ended != 0)) return "times of an op not started";
  return "";
}

}  // namespace

RR_TEST(keeps_the_last_ops_in_order_with_their_progress) {
  FlightRecorder f(meta(), 8);
  for (uint64_t s = 0; s < 21; ++s) {
    issue(f, s);
    f.started(s, at(10 * s + 2));
    if (s != 20) f.finished(s, s == 17 ? "timed out" : "", at(10 * s + 3));
  }
  const auto recs = f.snapshot();
  RR_REQUIRE(recs.size() == 8, "kept ", recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    RR_EXPECT(recs[i].seq == 13 + i, "record ", i, " is op ", recs[i].seq);
    RR_EXPECT(check(recs[i], State::Running).empty(), "op ", recs[i].seq, ": ", check(recs[i], State::Running));
  }
  RR_EXPECT(recs.back().state == State::Running, "the last op is still running");
  RR_EXPECT(recs.front().state == State::Completed, "the others ended");
  RR_EXPECT(recs[4].state == State::Failed && recs[4].error == "timed out", "op 17 failed: ", recs[4].error);
  const std::string json = f.to_json("requested");
  RR_EXPECT(json.find("\"ops_issued\": 21") != std::string::npos, json);
  RR_EXPECT(json.find("\"shapes\": \"[13, 6]\"") != std::string::npos, json);
}

RR_TEST(an_op_in_flight_keeps_its_slot_and_the_op_that_comes_round_to_it_is_kept_too) {
  // Op 0 stays in flight (an async op not waited for, a stuck one) while 8 more are issued: ops 4
  // and 8 come round to its slot. Kept: the last 4 ops, each with its own progress, and op 0.
  FlightRecorder f(meta(), 4);
  issue(f, 0);
  f.started(0, at(2));
  for (uint64_t s = 1; s <= 8; ++s) {
    issue(f, s);
    f.started(s, at(10 * s + 2));
    f.finished(s, "", at(10 * s + 3));
  }
  auto recs = f.snapshot();
  std::vector<uint64_t> seqs;
  for (const auto& r : recs) seqs.push_back(r.seq);
  RR_EXPECT((seqs == std::vector<uint64_t>{0, 5, 6, 7, 8}), "kept ", seqs.size(), " ops, first ", seqs[0]);
  for (const auto& r : recs) {
    RR_EXPECT(check(r, State::Running).empty(), "op ", r.seq, ": ", check(r, State::Running));
  }
  RR_EXPECT(recs[0].state == State::Running, "op 0 is still running");
  // Op 8 (in the side table) fails: its error is kept with it. Op 0 ends too, and leaves the
  // window.
  f.finished(8, "peer 1 died", at(83));
  f.finished(0, "timed out", at(3));
  recs = f.snapshot();
  RR_REQUIRE(recs.size() == 4 && recs[0].seq == 5, "kept ", recs.size(), " from op ", recs[0].seq);
  RR_EXPECT(recs[3].state == State::Failed && recs[3].error == "peer 1 died", "op 8: ", recs[3].error);
  // Once op 0 has ended its slot is free again; the side table's ops leave as the window moves.
  for (uint64_t s = 9; s <= 16; ++s) {
    issue(f, s, /*running=*/true);
    f.finished(s, "", at(10 * s + 3));
  }
  recs = f.snapshot();
  RR_REQUIRE(recs.size() == 4 && recs[0].seq == 13, "kept ", recs.size(), " from op ", recs[0].seq);
}

RR_TEST(an_op_with_many_tensors_or_dimensions_keeps_its_shapes) {
  FlightRecorder f(meta(), 4);
  // Ten tensors of one dimension: the slot holds the first four (all a dump shows).
  std::vector<std::vector<int64_t>> many;
  for (int64_t i = 0; i < 10; ++i) many.push_back({i + 1});
  f.issued(0, "allgather", shapes(many), "Float", at(1));
  // Four tensors of eight dimensions: more than a slot holds; kept whole in the side table.
  const std::vector<std::vector<int64_t>> deep(4, {1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<int64_t> flat;
  for (const auto& t : deep) {
    flat.insert(flat.end(), t.begin(), t.end());
    flat.push_back(-1);
  }
  f.issued(1, "allgather", shapes(deep), "Float", at(2));
  const std::string json = f.to_json("requested");
  RR_EXPECT(json.find("\"[1] [2] [3] [4] and 6 more\"") != std::string::npos, json);
  const std::string eight = "[1, 2, 3, 4, 5, 6, 7, 8]";
  RR_EXPECT(json.find(eight + " " + eight + " " + eight + " " + eight + "\"") != std::string::npos, json);
  const auto recs = f.snapshot();
  RR_EXPECT(recs.size() == 2 && recs[1].dims == flat && recs[1].tensors == 4, "the deep op's shapes");
}

RR_TEST(a_withdrawn_op_leaves_no_record_and_its_number_is_reused) {
  FlightRecorder f(meta(), 4);
  issue(f, 0, true);
  f.finished(0, "", at(3));
  issue(f, 1);
  f.withdraw(1);
  auto recs = f.snapshot();
  RR_EXPECT(recs.size() == 1 && recs[0].seq == 0, "withdrawn op 1 gone");
  RR_EXPECT(f.to_json("r").find("\"ops_issued\": 1,") != std::string::npos, "one op issued");
  issue(f, 1, true);
  recs = f.snapshot();
  RR_EXPECT(recs.size() == 2 && check(recs[1], State::Running).empty(), "op 1 issued again");
  FlightRecorder none(meta(), 0);
  issue(none, 0, true);
  none.finished(0, "boom", at(3));
  RR_EXPECT(none.snapshot().empty(), "a recorder of no ops keeps none");
}

namespace {

// One thread issues ops (as the backend does, one at a time), another runs them in order at most
// `lead` ops behind, as the progress thread does, and this one dumps meanwhile. Every record a dump
// shows must be one op's, whole: a record mixing two ops' fields fails check().
void dump_while_recording(size_t capacity, uint64_t lead, uint64_t total) {
  FlightRecorder f(meta(), capacity);
  std::atomic<uint64_t> issued{0}, ran{0};
  std::atomic<bool> done{false};
  std::thread issuer([&] {
    for (uint64_t s = 0; s < total; ++s) {
      while (s >= lead + ran.load(std::memory_order_acquire)) std::this_thread::yield();
      issue(f, s);
      issued.store(s + 1, std::memory_order_release);
    }
  });
  std::thread runner([&] {
    for (uint64_t s = 0; s < total; ++s) {
      while (issued.load(std::memory_order_acquire) <= s) std::this_thread::yield();
      f.started(s, at(10 * s + 2));
      f.finished(s, "", at(10 * s + 3));
      ran.store(s + 1, std::memory_order_release);
    }
    done.store(true);
  });
  long dumps = 0, bad = 0;
  std::string first_bad;
  while (!done.load()) {
    uint64_t last = 0;
    bool any = false;
    for (const auto& r : f.snapshot()) {
      const std::string why = check(r, State::Issued);
      if (!why.empty() || (any && r.seq <= last)) {
        if (bad++ == 0) first_bad = "op " + std::to_string(r.seq) + ": " + (why.empty() ? "order" : why);
      }
      any = true;
      last = r.seq;
    }
    ++dumps;
  }
  issuer.join();
  runner.join();
  RR_EXPECT(bad == 0, bad, " bad records in ", dumps, " dumps; the first: ", first_bad);
  RR_EXPECT(dumps > 0, "no dump was taken");
  const auto recs = f.snapshot();
  RR_EXPECT(recs.size() == capacity && recs.back().seq == total - 1 && recs.back().state == State::Completed,
            "the last ", capacity, " ops, ended: ", recs.size());
}

}  // namespace

RR_TEST(a_dump_while_ops_are_recorded_on_other_threads_sees_whole_records) {
  // Four slots, written over and over: a dump reads each while it is being written, often (with
  // the slots' versions not checked, this finds thousands of mixed records).
  dump_while_recording(4, 3, 100000);
  // 64 slots with up to 100 ops in flight: ops that find their slot busy go to the side table.
  dump_while_recording(64, 100, 200000);
}

RR_TEST_MAIN()

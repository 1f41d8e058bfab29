// SlotWrites (algo/handoff.h): which way large ops write what a peer reads next, chosen from the
// times of the group's own all-reduces. Fed made-up times here, so the choice is exact.
#include <cstddef>
#include <functional>

#include "common/error.h"
#include "algo/handoff.h"
#include "rrtest.h"

using namespace ringreduce;

namespace {

constexpr size_t kMin = 64 << 10;

// Runs `ops` timed ops of `bytes` through w, each taking `per_byte(streamed)` seconds per byte;
// returns how many of them streamed.
int run(SlotWrites& w, size_t bytes, int ops, const std::function<double(bool)>& per_byte) {
  int streamed = 0;
  for (int i = 0; i < ops; ++i) {
    const bool s = w.stream(bytes, true);
    streamed += s;
    w.done(bytes, s, per_byte(s) * static_cast<double>(bytes));
  }
  return streamed;
}

}  // namespace

RR_TEST(fixed_modes_and_the_threshold) {
  SlotWrites w;
  RR_EXPECT(!w.stream(1 << 30, true), "plain until configured");
  w.configure(SlotWrites::Mode::Stream, kMin, 0);
  RR_EXPECT(w.stream(kMin, true) && w.stream(kMin, false), "stream from the threshold on");
  RR_EXPECT(!w.stream(kMin - 1, true), "plain below the threshold");
  RR_EXPECT(!w.stream(0, true), "an empty op has nothing to write");
  w.configure(SlotWrites::Mode::Plain, kMin, 0);
  RR_EXPECT(!w.stream(1 << 30, true), "plain");
  RR_EXPECT(SlotWrites::parse("auto", "X") == SlotWrites::Mode::Auto, "parse");
  RR_EXPECT_THROWS(SlotWrites::parse("fast", "RINGREDUCE_STREAM"),
                   "RINGREDUCE_STREAM=fast must be auto, plain or stream");
}

RR_TEST(auto_tries_both_then_keeps_the_faster) {
  for (bool stream_faster : {false, true}) {
    SlotWrites w;
    w.configure(SlotWrites::Mode::Auto, kMin, 0);
    auto cost = [&](bool s) { return s == stream_faster ? 1e-10 : 5e-10; };
    // The first four ops alternate, plain first.
    int k = 0;
    for (; k < 4; ++k) {
      const bool s = w.stream(1 << 20, true);
      RR_EXPECT(s == (k % 2 == 1), "op ", k, " streamed=", s);
      w.done(1 << 20, s, cost(s) * (1 << 20));
    }
    // Then the faster way, but for one op in 32 that checks the other.
    const int streamed = run(w, 1 << 20, 320, cost);
    const int want = stream_faster ? 320 - 10 : 10;
    RR_EXPECT(streamed == want, "stream_faster=", stream_faster, ": ", streamed, " of 320 streamed");
    // Ops that are not timed follow the choice.
    RR_EXPECT(w.stream(1 << 20, false) == stream_faster, "untimed ops follow");
  }
}

RR_TEST(streaming_must_win_clearly) {
  // Where the two cores share no cache both ways are slow, streamed writes a little less so (at
  // 1 MiB, about 180 us against 200): too little to leave the cache the reader may share, and
  // ranks that switched on such a lead, each on its own, switched back and forth. 25% faster is
  // enough.
  for (double streamed_cost : {0.9e-10, 0.75e-10}) {
    SlotWrites w;
    w.configure(SlotWrites::Mode::Auto, kMin, 0);
    run(w, 1 << 20, 200, [&](bool s) { return s ? streamed_cost : 1e-10; });
    const bool want = streamed_cost < 0.8e-10;
    RR_EXPECT(w.stream(1 << 20, false) == want, "streamed at ", streamed_cost,
              " s/B against 1e-10 plain: ", !want);
    // Once streaming, it streams while that keeps a lead of 10%, and writes plainly below it.
    if (want) {
      run(w, 1 << 20, 100, [&](bool s) { return s ? 0.75e-10 : 0.85e-10; });
      RR_EXPECT(w.stream(1 << 20, false), "still streamed at 0.75 against 0.85");
      run(w, 1 << 20, 100, [&](bool s) { return s ? 0.75e-10 : 0.8e-10; });
      RR_EXPECT(!w.stream(1 << 20, false), "plain at 0.75 against 0.8");
    }
  }
}

RR_TEST(auto_follows_a_change_of_placement) {
  SlotWrites w;
  w.configure(SlotWrites::Mode::Auto, kMin, 0);
  // Cores that share a cache: plain wins.
  run(w, 16 << 20, 64, [](bool s) { return s ? 1.3e-10 : 1.0e-10; });
  RR_EXPECT(!w.stream(16 << 20, false), "plain while it is faster");
  // The cores are moved apart: plain becomes 5x slower. Within one exploring period (32 ops) the
  // group switches.
  run(w, 16 << 20, 40, [](bool s) { return s ? 1.3e-10 : 5.0e-10; });
  RR_EXPECT(w.stream(16 << 20, false), "streamed once plain has become slower");
  // And back.
  run(w, 16 << 20, 40, [](bool s) { return s ? 1.3e-10 : 1.0e-10; });
  RR_EXPECT(!w.stream(16 << 20, false), "plain again once it is faster again");
}

RR_TEST(small_ops_are_timed_in_batches) {
  // Ops under 64 KiB run and are timed in batches that make 64 KiB (8 KiB: 8 ops), each batch
  // one way: the four batches that alternate, then one batch in 32 that tries the other way.
  SlotWrites w;
  w.configure(SlotWrites::Mode::Auto, 4 << 10, 0);
  auto cost = [](bool s) { return s ? 2e-10 : 1e-10; };
  for (int k = 0; k < 32; ++k) {
    const bool s = w.stream(8 << 10, true);
    RR_EXPECT(s == ((k / 8) % 2 == 1), "op ", k, " of the first four batches: streamed=", s);
    w.done(8 << 10, s, cost(s) * (8 << 10));
  }
  RR_EXPECT(run(w, 8 << 10, 1024, cost) == 32, "8 KiB: 4 batches of 8 of 1024 ops streamed");
  // One slow op in a batch moves the batch's figure by its share only: the choice holds.
  const int streamed = run(w, 8 << 10, 256, [](bool s) { return s ? 2e-10 : 1e-10; });
  RR_EXPECT(streamed == 8, "one exploring batch in 256 ops: ", streamed);
  for (int k = 0; k < 8; ++k) w.done(8 << 10, false, (k == 0 ? 5e-10 : 1e-10) * (8 << 10));
  RR_EXPECT(!w.stream(8 << 10, false), "one late op does not move the choice");
  // From 64 KiB a batch is one op, as before.
  RR_EXPECT(run(w, 64 << 10, 4 + 320, cost) == 2 + 10, "64 KiB: one op in 32");
}

RR_TEST(sizes_are_judged_apart) {
  SlotWrites w;
  w.configure(SlotWrites::Mode::Auto, kMin, 0);
  // Small ops stay in cache (plain wins), large ones do not (streamed wins).
  run(w, 128 << 10, 64, [](bool s) { return s ? 2e-10 : 1e-10; });
  run(w, 64 << 20, 64, [](bool s) { return s ? 1e-10 : 3e-10; });
  RR_EXPECT(!w.stream(128 << 10, false), "128 KiB plain");
  RR_EXPECT(w.stream(64 << 20, false), "64 MiB streamed");
  // An outlier (a peer that arrived late) does not move a choice: the best recent figure counts.
  w.done(64 << 20, true, 1.0);
  RR_EXPECT(w.stream(64 << 20, false), "one slow op changes nothing");
}

RR_TEST_MAIN()

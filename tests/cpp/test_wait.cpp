// AdaptiveSpin (transport/wait.h): how long a waiting rank spins before it sleeps, from how its
// waits ended. Fed made-up waits here, so the rule is exact.
#include <chrono>

#include "transport/wait.h"
#include "rrtest.h"

using namespace ringreduce;
using std::chrono::microseconds;

RR_TEST(waits_that_end_soon_after_the_spin_grow_it_to_its_limit) {
  // A peer that keeps arriving 120 us after the rank starts waiting: a 50 us spin misses it
  // every time and the rank pays a wake-up; the spin doubles until it catches it, and no further.
  AdaptiveSpin s(microseconds(50), microseconds(1000));
  RR_EXPECT(s.now() == microseconds(50), "starts at its least");
  s.record(microseconds(120), true);
  RR_EXPECT(s.now() == microseconds(100), "doubled after a wait of 120 us: ", s.now().count());
  s.record(microseconds(120), true);
  RR_EXPECT(s.now() == microseconds(200), "doubled again: ", s.now().count());
  s.record(microseconds(120), false);  // caught within the spin: stays
  RR_EXPECT(s.now() == microseconds(200), "a wait caught by the spin leaves it: ", s.now().count());
  // Each wait within 4 spins (and within the limit) doubles it: 700 us at 200, 900 at 400, 950 at
  // 800; then it stays at the cap.
  for (int us : {700, 900, 950, 990}) s.record(microseconds(us), true);
  RR_EXPECT(s.now() == microseconds(1000), "capped at its limit: ", s.now().count());
}

RR_TEST(a_peer_that_is_really_away_shrinks_it) {
  // Waits far beyond the spin (the peer had work of its own): a longer spin only burns the core.
  AdaptiveSpin s(microseconds(50), microseconds(1000));
  for (int i = 0; i < 5; ++i) s.record(microseconds(150), true);
  RR_EXPECT(s.now() == microseconds(1000), "grown: ", s.now().count());
  s.record(microseconds(4001), true);  // over 4 spins
  RR_EXPECT(s.now() == microseconds(500), "halved: ", s.now().count());
  for (int i = 0; i < 10; ++i) s.record(std::chrono::milliseconds(50), true);
  RR_EXPECT(s.now() == microseconds(50), "down to its least: ", s.now().count());
}

RR_TEST(a_peer_further_away_than_the_limit_shrinks_it) {
  // At the limit, a peer 1.5 ms away is missed by the longest spin allowed: spinning 1 ms for it at
  // every op only burns the core, so the spin comes down again.
  AdaptiveSpin s(microseconds(50), microseconds(1000));
  for (int us : {150, 300, 700, 900, 990}) s.record(microseconds(us), true);
  RR_EXPECT(s.now() == microseconds(1000), "at the limit: ", s.now().count());
  s.record(microseconds(1500), true);
  RR_EXPECT(s.now() == microseconds(500), "halved: ", s.now().count());
  for (int i = 0; i < 5; ++i) s.record(microseconds(1500), true);
  RR_EXPECT(s.now() == microseconds(50), "down to its least: ", s.now().count());
}

RR_TEST(a_spin_of_zero_can_grow) {
  // RINGREDUCE_SPIN_US=0 with a limit: doubling nothing would leave it at 0 for good.
  AdaptiveSpin s(microseconds(0), microseconds(1000));
  s.record(microseconds(3), true);
  RR_EXPECT(s.now() == microseconds(2), "from 0 to 2 us after a wait of 3: ", s.now().count());
}

RR_TEST(a_limit_at_or_below_the_spin_keeps_it_fixed) {
  // With more ranks than cores, or RINGREDUCE_SPIN_US set alone, the spin does not move.
  AdaptiveSpin fixed(microseconds(1), microseconds(1));
  AdaptiveSpin below(microseconds(20), microseconds(5));
  for (int i = 0; i < 5; ++i) {
    fixed.record(microseconds(3), true);
    below.record(microseconds(30), true);
  }
  RR_EXPECT(fixed.now() == microseconds(1), "fixed: ", fixed.now().count());
  RR_EXPECT(below.now() == microseconds(20), "below: ", below.now().count());
}

RR_TEST_MAIN()

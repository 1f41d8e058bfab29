// Point-to-point over the shared-memory transport, with threads as ranks: tag matching, receives
// from any source, messages of many slices, mismatches, timeouts and shutdown with requests
// pending. The sanitizer builds see every access of the engine thread and the callers.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "map_bootstrap.h"
#include "p2p/p2p.h"
#include "rrtest.h"
#include "transport/shm/shm_transport.h"

using namespace ringreduce;
using std::chrono::milliseconds;

namespace {

std::string dtype_name(uint8_t code) { return "dtype#" + std::to_string(code); }

// The outcome of one request, filled in by the engine thread.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  int source = -1;

  P2p::Done callback() {
    return [this](std::exception_ptr e, int src) {
      std::string what;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          what = x.what();
        }
      }
      std::lock_guard<std::mutex> l(mu);
      error = what;
      source = src;
      done = true;
      cv.notify_all();
    };
  }
  // Waits (bounded: a hang fails the test instead of the run).
  bool wait(milliseconds at_most = milliseconds(30000)) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, at_most, [this] { return done; });
  }
};

ShmConfig config(size_t slot_bytes) {
  ShmConfig c;
  c.slot_bytes = slot_bytes;
  c.nslots = 2;
  c.spin = std::chrono::microseconds(20);
  c.doorbells = true;
  return c;
}

// Runs fn(rank, p2p) on n threads, each with its own transport and engine, built at once.
std::vector<std::string> run_group(int n, size_t slot_bytes,
                                   const std::function<void(int, P2p&)>& fn) {
  MapBootstrap bs;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmTransport t(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, config(slot_bytes));
        P2p p2p(t, dtype_name);
        fn(r, p2p);
        // Every rank is done before any engine stops (a peer's shutdown refuses what is left).
        bs.add("done", 1);
        while (std::stoll(bs.get("done")) < n) std::this_thread::yield();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      } catch (const rrtest::RequireFailed&) {
        errors[r] = "a requirement failed (above)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

uint8_t byte_of(int src, int dst, int tag, size_t i) {
  return static_cast<uint8_t>(i * 131 + static_cast<size_t>(src) * 17 + static_cast<size_t>(dst) * 5 +
                              static_cast<size_t>(tag) * 3);
}

void expect_no_errors(const std::vector<std::string>& errors, const std::string& what) {
  for (size_t r = 0; r < errors.size(); ++r) {
    RR_EXPECT(errors[r].empty(), what, ": rank ", r, ": ", errors[r]);
  }
}

}  // namespace

RR_TEST(every_pair_every_size_receives_posted_in_reverse) {
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 1000, 4096 * 3 + 7};
  for (int n = 2; n <= 4; ++n) {
    auto errors = run_group(n, 64, [&](int r, P2p& p2p) {
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<std::unique_ptr<Outcome>> outcomes;
      for (int dst = 0; dst < n; ++dst) {
        if (dst == r) continue;
        for (size_t k = 0; k < sizes.size(); ++k) {
          out.emplace_back(sizes[k]);
          for (size_t i = 0; i < sizes[k]; ++i) out.back()[i] = byte_of(r, dst, static_cast<int>(k), i);
          outcomes.push_back(std::make_unique<Outcome>());
          p2p.send(out.back().data(), sizes[k], 1, dst, static_cast<int>(k), milliseconds(20000),
                   outcomes.back()->callback());
        }
      }
      struct Expect { int src; int tag; size_t index; };
      std::vector<Expect> expects;
      in.reserve(static_cast<size_t>(n) * sizes.size());
      for (int src = n - 1; src >= 0; --src) {
        if (src == r) continue;
        for (size_t k = sizes.size(); k-- > 0;) {
          in.emplace_back(sizes[k], 0xEE);
          outcomes.push_back(std::make_unique<Outcome>());
          p2p.recv(in.back().data(), sizes[k], 1, src, static_cast<int>(k), milliseconds(20000),
                   outcomes.back()->callback());
          expects.push_back({src, static_cast<int>(k), in.size() - 1});
        }
      }
      for (auto& o : outcomes) {
        RR_REQUIRE(o->wait(), "rank ", r, ": a request did not complete");
        RR_EXPECT(o->error.empty(), "rank ", r, ": ", o->error);
      }
      for (const Expect& e : expects) {
        const auto& buf = in[e.index];
        for (size_t i = 0; i < buf.size(); ++i) {
          if (buf[i] != byte_of(e.src, r, e.tag, i)) {
            RR_EXPECT(false, "n=", n, " rank ", r, " from ", e.src, " tag ", e.tag, " byte ", i, " wrong");
            break;
          }
        }
      }
    });
    expect_no_errors(errors, "n=" + std::to_string(n));
  }
}

RR_TEST(any_source_reports_who_sent) {
  auto errors = run_group(4, 256, [](int r, P2p& p2p) {
    if (r == 0) {
      std::vector<int> seen;
      for (int k = 0; k < 3; ++k) {
        int32_t v = -1;
        Outcome o;
        p2p.recv(&v, sizeof v, 2, -1, 5, milliseconds(20000), o.callback());
        RR_REQUIRE(o.wait(), "any-source recv did not complete");
        RR_EXPECT(o.error.empty(), o.error);
        RR_EXPECT(v == o.source * 100, "got ", v, " from rank ", o.source);
        seen.push_back(o.source);
      }
      std::sort(seen.begin(), seen.end());
      RR_EXPECT((seen == std::vector<int>{1, 2, 3}), "sources seen: ", seen.size());
    } else {
      int32_t v = r * 100;
      Outcome o;
      p2p.send(&v, sizeof v, 2, 0, 5, milliseconds(20000), o.callback());
      RR_REQUIRE(o.wait(), "send did not complete");
      RR_EXPECT(o.error.empty(), o.error);
    }
  });
  expect_no_errors(errors, "any source");
}

RR_TEST(size_mismatch_fails_both_sides_and_the_channel_goes_on) {
  auto errors = run_group(2, 64, [](int r, P2p& p2p) {
    std::vector<uint8_t> buf(r == 0 ? 100 : 120);
    Outcome o;
    if (r == 0) {
      p2p.send(buf.data(), buf.size(), 1, 1, 0, milliseconds(20000), o.callback());
    } else {
      p2p.recv(buf.data(), buf.size(), 1, 0, 0, milliseconds(20000), o.callback());
    }
    RR_REQUIRE(o.wait(), "rank ", r, ": mismatched request did not complete");
    RR_EXPECT(o.error.find("must agree") != std::string::npos &&
                  o.error.find(r == 0 ? "120 bytes" : "100 bytes") != std::string::npos,
              "rank ", r, ": ", o.error);
    uint64_t v = r == 0 ? 42 : 0;
    Outcome again;
    if (r == 0) {
      p2p.send(&v, sizeof v, 1, 1, 1, milliseconds(20000), again.callback());
    } else {
      p2p.recv(&v, sizeof v, 1, 0, 1, milliseconds(20000), again.callback());
    }
    RR_REQUIRE(again.wait(), "rank ", r, ": request after a mismatch did not complete");
    RR_EXPECT(again.error.empty() && v == 42, "rank ", r, ": after a mismatch: ", again.error, " v=", v);
  });
  expect_no_errors(errors, "mismatch");
}

RR_TEST(unmatched_requests_time_out_alone_and_withdrawn_sends_stay_withdrawn) {
  MapBootstrap sync;  // a barrier between the two phases
  auto errors = run_group(2, 64, [&sync](int r, P2p& p2p) {
    uint32_t v = r == 0 ? 7 : 0;
    Outcome o;
    const auto start = Clock::now();
    if (r == 0) {
      p2p.send(&v, sizeof v, 1, 1, 3, milliseconds(300), o.callback());
    } else {
      p2p.recv(&v, sizeof v, 1, 0, 4, milliseconds(300), o.callback());
    }
    RR_REQUIRE(o.wait(), "rank ", r, ": unmatched request never ended");
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    RR_EXPECT(s < 5.0, "rank ", r, ": timed out after ", s, " s (timeout 0.3 s)");
    RR_EXPECT(o.error.find(r == 0 ? "no matching recv" : "no matching send") != std::string::npos,
              "rank ", r, ": ", o.error);
    sync.add("phase", 1);
    while (std::stoll(sync.get("phase")) < 2) std::this_thread::yield();
    // Tag 3 again: the receive gets the new send, never the withdrawn one.
    v = r == 0 ? 8 : 0;
    Outcome again;
    if (r == 0) {
      p2p.send(&v, sizeof v, 1, 1, 3, milliseconds(20000), again.callback());
    } else {
      p2p.recv(&v, sizeof v, 1, 0, 3, milliseconds(20000), again.callback());
    }
    RR_REQUIRE(again.wait(), "rank ", r, ": the second pair did not complete");
    RR_EXPECT(again.error.empty(), "rank ", r, ": ", again.error);
    if (r == 1) RR_EXPECT(v == 8, "got ", v, " (7 is the withdrawn send)");
  });
  expect_no_errors(errors, "timeouts");
}

// A request that times out names where the chain of waits from its peer ends: rank 0 waits for
// rank 2, which waits for rank 1, which waits for nobody (it posted nothing).
RR_TEST(a_timeout_follows_the_chain_of_waits) {
  MapBootstrap sync;
  auto errors = run_group(3, 64, [&sync](int r, P2p& p2p) {
    uint32_t v = 0;
    Outcome o;
    if (r == 2) {
      p2p.recv(&v, sizeof v, 1, 1, 0, milliseconds(20000), o.callback());  // rank 1 never sends
    } else if (r == 0) {
      std::this_thread::sleep_for(milliseconds(200));  // sleep-ok: rank 2's receive is posted first
      p2p.recv(&v, sizeof v, 1, 2, 0, milliseconds(500), o.callback());
      RR_REQUIRE(o.wait(), "rank 0: its receive never ended");
      RR_EXPECT(o.error.find("no matching send arrived: rank 2 waits for rank 1, which waits for no other rank") !=
                    std::string::npos,
                "rank 0: ", o.error);
      sync.set("done", "1");
      return;
    }
    sync.get("done");
    if (r == 2) {  // ends its receive: rank 1 sends now
      RR_REQUIRE(o.wait(), "rank 2: its receive never ended");
    } else {
      p2p.send(&v, sizeof v, 1, 2, 0, milliseconds(20000), o.callback());
      RR_REQUIRE(o.wait(), "rank 1: its send never ended");
    }
    RR_EXPECT(o.error.empty(), "rank ", r, ": ", o.error);
  });
  expect_no_errors(errors, "chain");
}

RR_TEST(shutdown_fails_what_is_unmatched_and_refuses_peers_sends) {
  MapBootstrap bs;
  std::string err0, err1;
  std::thread t0([&] {
    try {
      ShmTransport t(bs, incarnation_prefix(bs, 0, 2, kJoinTimeout), 0, 2, config(64));
      P2p p2p(t, dtype_name);
      uint32_t v = 0, w = 0;
      Outcome pending, marker;
      p2p.recv(&v, sizeof v, 1, 1, 9, milliseconds(20000), pending.callback());
      // Rank 1 sends tag 10, then tag 11. Messages of a pair arrive in order, so once tag 11 is
      // here, tag 10's send is held here unmatched.
      p2p.recv(&w, sizeof w, 1, 1, 11, milliseconds(20000), marker.callback());
      RR_REQUIRE(marker.wait(), "the marker recv did not complete");
      p2p.shutdown();
      RR_REQUIRE(pending.wait(), "pending recv not failed by shutdown");
      RR_EXPECT(pending.error.find("shut down") != std::string::npos, pending.error);
      bs.set("shut", "1");
      bs.get("checked");
    } catch (const std::exception& e) {
      err0 = e.what();
    } catch (const rrtest::RequireFailed&) {
      err0 = "a requirement failed";
    }
  });
  std::thread t1([&] {
    try {
      ShmTransport t(bs, incarnation_prefix(bs, 1, 2, kJoinTimeout), 1, 2, config(64));
      P2p p2p(t, dtype_name);
      uint32_t v = 1, w = 2;
      Outcome refused, marker;
      p2p.send(&v, sizeof v, 1, 0, 10, milliseconds(20000), refused.callback());
      p2p.send(&w, sizeof w, 1, 0, 11, milliseconds(20000), marker.callback());
      RR_REQUIRE(refused.wait(milliseconds(10000)), "send to a rank that shut down never ended");
      RR_EXPECT(refused.error.find("shut its process group down") != std::string::npos, refused.error);
      RR_EXPECT(marker.wait() && marker.error.empty(), "marker send: ", marker.error);
      bs.get("shut");
      bs.set("checked", "1");
    } catch (const std::exception& e) {
      err1 = e.what();
    } catch (const rrtest::RequireFailed&) {
      err1 = "a requirement failed";
    }
  });
  t0.join();
  t1.join();
  RR_EXPECT(err0.empty(), "rank 0: ", err0);
  RR_EXPECT(err1.empty(), "rank 1: ", err1);
}

RR_TEST(random_traffic_between_four_ranks) {
  // Each rank sends 60 messages of random sizes to random peers with random tags out of a few;
  // every receive names source and tag, posted in a shuffled order. Messages with the same
  // source, destination and tag arrive in the order sent (the contents say which is which).
  const int n = 4, per_rank = 60;
  struct Msg { int src, dst, tag; size_t bytes; int nth; };
  std::mt19937 rng(11);
  std::vector<Msg> msgs;
  std::map<std::tuple<int, int, int>, int> counts;
  for (int src = 0; src < n; ++src) {
    for (int k = 0; k < per_rank; ++k) {
      int dst = static_cast<int>(rng() % (n - 1));
      if (dst >= src) ++dst;
      const int tag = static_cast<int>(rng() % 3);
      const size_t bytes = (rng() % 4 == 0) ? rng() % 5000 : rng() % 200;
      msgs.push_back({src, dst, tag, bytes, counts[{src, dst, tag}]++});
    }
  }
  auto errors = run_group(n, 128, [&](int r, P2p& p2p) {
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<const Msg*> mine_in;
    std::vector<std::unique_ptr<Outcome>> outcomes;
    bufs.reserve(msgs.size());
    for (const Msg& m : msgs) {
      if (m.src != r) continue;
      bufs.emplace_back(m.bytes);
      for (size_t i = 0; i < m.bytes; ++i) bufs.back()[i] = byte_of(m.src, m.dst, m.tag * 100 + m.nth, i);
      outcomes.push_back(std::make_unique<Outcome>());
      p2p.send(bufs.back().data(), m.bytes, 1, m.dst, m.tag, milliseconds(30000), outcomes.back()->callback());
    }
    for (const Msg& m : msgs) {
      if (m.dst == r) mine_in.push_back(&m);
    }
    // Posted grouped by (source, tag), not in the order the sends come; within one source and
    // tag in send order, since receives of one source and tag match in post order.
    std::stable_sort(mine_in.begin(), mine_in.end(), [](const Msg* a, const Msg* b) {
      return std::make_pair(a->src, a->tag) < std::make_pair(b->src, b->tag);
    });
    std::vector<size_t> in_index;
    for (const Msg* m : mine_in) {
      bufs.emplace_back(m->bytes, 0xEE);
      in_index.push_back(bufs.size() - 1);
      outcomes.push_back(std::make_unique<Outcome>());
      p2p.recv(bufs.back().data(), m->bytes, 1, m->src, m->tag, milliseconds(30000), outcomes.back()->callback());
    }
    for (auto& o : outcomes) {
      RR_REQUIRE(o->wait(), "rank ", r, ": a request did not complete");
      RR_EXPECT(o->error.empty(), "rank ", r, ": ", o->error);
    }
    for (size_t k = 0; k < mine_in.size(); ++k) {
      const Msg& m = *mine_in[k];
      const auto& b = bufs[in_index[k]];
      for (size_t i = 0; i < b.size(); ++i) {
        if (b[i] != byte_of(m.src, m.dst, m.tag * 100 + m.nth, i)) {
          RR_EXPECT(false, "rank ", r, ": message #", m.nth, " from ", m.src, " tag ", m.tag, " wrong at ", i);
          break;
        }
      }
    }
  });
  expect_no_errors(errors, "random traffic");
}

RR_TEST_MAIN()

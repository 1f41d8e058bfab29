// The algorithm layer (csrc/algo) over the shared-memory transport and its window, with threads
// as ranks: every algorithm forced in turn against exact integer sums, the three giving the same
// float bits, the window forms of the other collectives, and ranks that disagree failing on every
// rank before any output is written. The sanitizer builds see every access to the window.
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "algo/collectives.h"
#include "common/error.h"
#include "map_bootstrap.h"
#include "rrtest.h"
#include "transport/shm/shm_transport.h"

using namespace ringreduce;
using std::chrono::milliseconds;

namespace {

const Algo kAlgos[] = {Algo::Ring, Algo::OneShot, Algo::TwoShot};

// Runs fn(rank, collectives) on n threads, with `algo` forced; returns each rank's error ("" if none).
// `span`: the window's halves (ShmConfig::window_span), 0 for the default.
std::vector<std::string> run_group(int n, Algo algo, const std::function<void(int, Collectives&)>& fn,
                                   size_t window_bytes = 1 << 20, size_t span = 0) {
  MapBootstrap bs;
  ShmConfig cfg;
  cfg.slot_bytes = 4096;  // small slices: the ring runs many of them
  cfg.nslots = 2;
  cfg.window_bytes = window_bytes;
  cfg.window_span = span;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmTransport t(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, cfg);
        Messages msgs(t, cfg.slot_bytes);
        Collectives coll(msgs, t.window(), Selector(n, cfg.window_bytes, algo));
        fn(r, coll);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

OpContext ctx(uint64_t seq, const char* name) {
  OpContext c;
  c.name = name;
  c.seq = seq;
  c.timeout = milliseconds(20000);
  return c;
}

int32_t input_of(int rank, size_t i) {
  return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(rank) * 40503u) % 2001) - 1000;
}

}  // namespace

RR_TEST(every_algorithm_sums_int32_exactly) {
  for (int n : {2, 3, 4}) {
    for (Algo a : kAlgos) {
      std::vector<std::string> bad(n);
      auto errors = run_group(n, a, [&](int r, Collectives& coll) {
        uint64_t seq = 0;
        for (size_t count : {size_t(0), size_t(1), size_t(n - 1), size_t(1009), size_t(70001)}) {
          std::vector<int32_t> in(count), out(count, 7);
          for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i);
          coll.allreduce(in.data(), out.data(), count, DType::Int32, RedOp::Sum, 1,
                         ctx(seq++, "allreduce"), Deadline::after(milliseconds(20000)));
          for (size_t i = 0; i < count && bad[r].empty(); ++i) {
            int32_t want = 0;
            for (int p = 0; p < n; ++p) want += input_of(p, i);
            if (out[i] != want) bad[r] = rrtest::message("count=", count, " i=", i, " got ", out[i], " want ", want);
          }
        }
      });
      for (int r = 0; r < n; ++r) {
        RR_EXPECT(errors[r].empty() && bad[r].empty(), "n=", n, " ", algo_name(a), " rank ", r, ": ",
                  errors[r], bad[r]);
      }
    }
  }
}

// One-shot reads a rank's own contribution from its input where the output is the input or lies
// apart from it, and from its window copy where the two partly overlap (which reduce_many could not
// read): the sums are right in all three cases.
RR_TEST(oneshot_reads_its_own_part_from_the_input_or_the_window) {
  const int n = 2;
  const size_t count = 3001;
  for (size_t shift : {size_t(0), count, size_t(3)}) {  // in place, apart, partly overlapping
    std::vector<std::string> bad(n);
    auto errors = run_group(n, Algo::OneShot, [&](int r, Collectives& coll) {
      std::vector<int32_t> buf(count + shift);
      for (size_t i = 0; i < count; ++i) buf[i] = input_of(r, i);
      coll.allreduce(buf.data(), buf.data() + shift, count, DType::Int32, RedOp::Sum, 1,
                     ctx(0, "allreduce"), Deadline::after(milliseconds(20000)));
      for (size_t i = 0; i < count && bad[r].empty(); ++i) {
        const int32_t want = input_of(0, i) + input_of(1, i);
        if (buf[shift + i] != want) bad[r] = rrtest::message("i=", i, " got ", buf[shift + i], " want ", want);
      }
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(errors[r].empty() && bad[r].empty(), "shift=", shift, " rank ", r, ": ", errors[r], bad[r]);
    }
  }
}

RR_TEST(the_algorithms_give_the_same_float_bits) {
  const int n = 3;
  const size_t count = 5003;
  std::vector<std::vector<float>> results;
  for (Algo a : kAlgos) {
    std::vector<float> got(count);
    auto errors = run_group(n, a, [&](int r, Collectives& coll) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = 0.1f * static_cast<float>(input_of(r, i)) + 1e-3f * r;
      coll.allreduce(buf.data(), buf.data(), count, DType::Float32, RedOp::Sum, n, ctx(0, "allreduce"),
                     Deadline::after(milliseconds(20000)));
      if (r == 1) got = buf;
    });
    for (auto& e : errors) RR_EXPECT(e.empty(), algo_name(a), ": ", e);
    results.push_back(got);
  }
  RR_EXPECT(std::memcmp(results[0].data(), results[1].data(), count * 4) == 0, "oneshot differs from the ring");
  RR_EXPECT(std::memcmp(results[0].data(), results[2].data(), count * 4) == 0, "twoshot differs from the ring");
}

RR_TEST(window_forms_of_the_other_collectives) {
  const int n = 3;
  const size_t count = 777;
  std::vector<std::string> bad(n);
  auto errors = run_group(n, Algo::OneShot, [&](int r, Collectives& coll) {
    const Deadline dl = Deadline::after(milliseconds(20000));
    uint64_t seq = 0;
    auto expect = [&](bool ok, const char* what) {
      if (!ok && bad[r].empty()) bad[r] = what;
    };
    std::vector<int32_t> mine(count), all(count * n);
    for (size_t i = 0; i < count; ++i) mine[i] = input_of(r, i);
    coll.all_gather(mine.data(), Chunks(all.data(), count * 4), count, DType::Int32, ctx(seq++, "allgather"), dl);
    for (int p = 0; p < n; ++p) {
      for (size_t i = 0; i < count; ++i) expect(all[p * count + i] == input_of(p, i), "allgather");
    }
    std::vector<int32_t> in(count * n), out(count);
    for (size_t i = 0; i < in.size(); ++i) in[i] = input_of(r, i);
    coll.reduce_scatter(Chunks(in.data(), count * 4), out.data(), count, DType::Int32, RedOp::Max, 1,
                        ctx(seq++, "reduce_scatter"), dl);
    for (size_t i = 0; i < count; ++i) {
      int32_t want = input_of(0, r * count + i);
      for (int p = 1; p < n; ++p) want = std::max(want, input_of(p, r * count + i));
      expect(out[i] == want, "reduce_scatter");
    }
    for (int root = 0; root < n; ++root) {
      std::vector<int32_t> b(count, r == root ? 5 : -1);
      coll.broadcast(b.data(), count, DType::Int32, root, ctx(seq++, "broadcast"), dl);
      for (int32_t v : b) expect(v == 5, "broadcast");
      std::vector<int32_t> red(count, 9);
      coll.reduce(mine.data(), red.data(), count, DType::Int32, RedOp::Sum, 1, root, ctx(seq++, "reduce"), dl);
      for (size_t i = 0; i < count && r == root; ++i) {
        int32_t want = 0;
        for (int p = 0; p < n; ++p) want += input_of(p, i);
        expect(red[i] == want, "reduce");
      }
    }
    coll.barrier(ctx(seq++, "barrier"), dl);
  });
  for (int r = 0; r < n; ++r) RR_EXPECT(errors[r].empty() && bad[r].empty(), "rank ", r, ": ", errors[r], bad[r]);
}

RR_TEST(ranks_that_disagree_fail_everywhere_and_write_no_output) {
  for (Algo a : {Algo::OneShot, Algo::TwoShot}) {
    const int n = 3;
    std::vector<int> untouched(n, 0);
    auto errors = run_group(n, a, [&](int r, Collectives& coll) {
      const size_t count = r == 2 ? 60 : 100;  // rank 2 disagrees
      std::vector<int32_t> in(count, 1), out(count, -7);
      try {
        coll.allreduce(in.data(), out.data(), count, DType::Int32, RedOp::Sum, 1, ctx(0, "allreduce"),
                       Deadline::after(milliseconds(20000)));
      } catch (...) {
        bool same = true;
        for (int32_t v : out) same = same && v == -7;
        untouched[r] = same;
        throw;
      }
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(errors[r].find("called different collectives") != std::string::npos &&
                    errors[r].find("100") != std::string::npos && errors[r].find("60") != std::string::npos,
                algo_name(a), " rank ", r, ": ", errors[r]);
      RR_EXPECT(untouched[r], algo_name(a), " rank ", r, ": the output was written");
    }
  }
}

// Each window op's region follows the previous one's, or starts the other half where it does not
// fit (or is small): it never overlaps the previous op's region (which a peer may still read), and
// stays in the window, whatever the mix of sizes (0 and the whole capacity included).
RR_TEST(window_regions_never_overlap_the_previous_op) {
  const size_t cap = 48 * 1024, span = 64 * 1024;
  const int n = 2;
  MapBootstrap bs;
  ShmConfig cfg;
  cfg.window_bytes = cap;
  cfg.window_span = span;
  std::vector<std::string> bad(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmTransport t(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, cfg);
        PeerWindow* w = t.window();
        RR_CHECK(w != nullptr, "no window");
        const uint8_t* lo = nullptr;
        const uint8_t* prev = nullptr;
        size_t prev_bytes = 0;
        uint32_t x = 12345;  // the same sizes on both ranks
        for (uint64_t seq = 0; seq < 400 && bad[r].empty(); ++seq) {
          x = x * 1103515245u + 12345u;
          const size_t choice = (x >> 8) % 6;
          // The first op takes the window's start: where the others are measured from.
          const size_t bytes = seq == 0      ? cap
                               : choice == 0 ? 0
                               : choice == 1 ? cap
                               : choice == 2 ? ((x >> 12) % 4096) & ~size_t(3)  // below the moving size
                                             : ((x >> 12) % cap) & ~size_t(3);
          MsgHeader fp;
          fp.seq = seq;
          fp.count = bytes;
          const OpContext c = ctx(seq, "window");
          uint8_t* mine = w->begin(fp, c, bytes);
          if (lo == nullptr) lo = mine;
          if (mine < lo || mine + bytes > lo + 2 * span) {
            bad[r] = rrtest::message("op ", seq, ": region at ", mine - lo, " of ", bytes, " bytes outside the window");
          } else if (prev != nullptr && mine < prev + prev_bytes && prev < mine + bytes) {
            bad[r] = rrtest::message("op ", seq, ": region at ", mine - lo, " (", bytes, " bytes) overlaps the previous op's at ",
                                     prev - lo, " (", prev_bytes, " bytes)");
          }
          if (bytes > 0) std::memset(mine, static_cast<int>(seq & 0xff), bytes);
          w->publish();
          w->wait_all(c, Deadline::after(milliseconds(20000)));
          const uint8_t* theirs = w->buffer(1 - r);
          for (size_t i = 0; i < bytes && bad[r].empty(); i += 61) {
            if (theirs[i] != static_cast<uint8_t>(seq & 0xff)) bad[r] = rrtest::message("op ", seq, ": byte ", i, " of the peer's region");
          }
          prev = mine;
          prev_bytes = bytes;
        }
      } catch (const std::exception& e) {
        bad[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) RR_EXPECT(bad[r].empty(), "rank ", r, ": ", bad[r]);
}

// Many all-reduces of mixed sizes, with one rank now and then running behind (so that its peers
// start the next op while it still reads the last): exact sums, through regions that wrap at
// every point of a small window.
RR_TEST(window_ops_of_mixed_sizes_with_a_rank_behind) {
  for (Algo a : {Algo::OneShot, Algo::TwoShot}) {
    for (int n : {2, 3}) {
      std::vector<std::string> bad(n);
      auto errors = run_group(n, a, [&](int r, Collectives& coll) {
        uint32_t x = 777;
        for (uint64_t seq = 0; seq < 300 && bad[r].empty(); ++seq) {
          x = x * 1103515245u + 12345u;
          const size_t count = (x >> 9) % (12 * 1024 + 1);  // up to 48 KiB of int32
          std::vector<int32_t> in(count), out(count, 7);
          for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i + seq);
          if ((x >> 3) % n == static_cast<uint32_t>(r)) {
            volatile uint64_t spin = 0;
            for (int i = 0; i < 20000; ++i) spin = spin + i;  // this rank runs behind this time
          }
          coll.allreduce(in.data(), out.data(), count, DType::Int32, RedOp::Sum, 1, ctx(seq, "allreduce"),
                         Deadline::after(milliseconds(20000)));
          for (size_t i = 0; i < count && bad[r].empty(); ++i) {
            int32_t want = 0;
            for (int p = 0; p < n; ++p) want += input_of(p, i + seq);
            if (out[i] != want) bad[r] = rrtest::message("op ", seq, " count=", count, " i=", i, " got ", out[i], " want ", want);
          }
        }
      }, 48 * 1024, 64 * 1024);
      for (int r = 0; r < n; ++r) {
        RR_EXPECT(errors[r].empty() && bad[r].empty(), algo_name(a), " world ", n, " rank ", r, ": ", errors[r], bad[r]);
      }
    }
  }
}

RR_TEST_MAIN()

// The message algorithms (algo/ring.h, chain.h, star.h, pairwise.h) over the shared-memory
// transport, with threads as ranks: the segments, FIFOs and futex waits are exactly those used
// between processes, and the sanitizer builds see every access.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"
#include "map_bootstrap.h"
#include "algo/chain.h"
#include "algo/messages.h"
#include "algo/pairwise.h"
#include "algo/ring.h"
#include "algo/star.h"
#include "rrtest.h"
#include "transport/shm/shm_transport.h"

using namespace ringreduce;
using std::chrono::milliseconds;

namespace {

struct RankResult {
  std::string error;  // what() of the exception the rank ended with, "" if none
  bool timeout = false;
  bool aborted = false;
  double seconds = 0;
};

// One rank's message algorithms, over one Messages.
struct Algos {
  Algos(Transport& t, size_t slice_bytes)
      : msgs(t, slice_bytes), ring(msgs), chain(msgs), star(msgs), pairwise(msgs) {}
  Messages msgs;
  Ring ring;
  Chain chain;
  Star star;
  Pairwise pairwise;
};

// Runs fn(rank, algorithms, transport) on n threads, one transport per thread, all built at once.
std::vector<RankResult> run_group(int n, ShmConfig cfg,
                                  const std::function<void(int, Algos&, ShmTransport&)>& fn) {
  MapBootstrap bs;
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto start = Clock::now();
      try {
        ShmTransport t(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, cfg);
        Algos a(t, cfg.slot_bytes);
        fn(r, a, t);
      } catch (const TimeoutError& e) {
        results[r].error = e.what();
        results[r].timeout = true;
      } catch (const AbortedError& e) {
        results[r].error = e.what();
        results[r].aborted = true;
      } catch (const std::exception& e) {
        results[r].error = e.what();
      }
      results[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

ShmConfig config(size_t slot_bytes, uint32_t slots) {
  ShmConfig c;
  c.slot_bytes = slot_bytes;
  c.nslots = slots;
  c.spin = std::chrono::microseconds(20);
  return c;
}

OpContext ctx(uint64_t seq, const char* name = "allreduce") {
  OpContext c;
  c.name = name;
  c.seq = seq;
  c.timeout = milliseconds(20000);
  return c;
}

int32_t input_of(int rank, size_t i, uint32_t seed) {
  return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(rank) * 40503u + seed) % 2001) - 1000;
}

void expect_all_ok(const std::vector<RankResult>& res, const std::string& what) {
  for (size_t r = 0; r < res.size(); ++r) {
    RR_EXPECT(res[r].error.empty(), what, ": rank ", r, " failed: ", res[r].error);
  }
}

}  // namespace

RR_TEST(allreduce_int32_sum_exact_over_sizes_slices_and_slots) {
  std::mt19937 rng(7);
  for (int n = 1; n <= 4; ++n) {
    for (size_t slot : {size_t(64), size_t(4096)}) {
      for (uint32_t slots : {2u, 3u}) {
        const std::vector<size_t> counts = {0, 1, size_t(n > 1 ? n - 1 : 2), 1009, 100003};
        const uint32_t seed = rng();
        std::vector<std::vector<std::vector<int32_t>>> outs(n);
        auto res = run_group(n, config(slot, slots), [&](int r, Algos& a, ShmTransport&) {
          uint64_t seq = 0;
          for (size_t count : counts) {
            for (int inplace = 0; inplace < 2; ++inplace) {
              std::vector<int32_t> in(count), out(count, 12345);
              for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i, seed);
              if (inplace) {
                a.ring.allreduce(in.data(), in.data(), count, DType::Int32, RedOp::Sum, 1, ctx(seq++),
                                 Deadline::after(milliseconds(20000)));
                outs[r].push_back(in);
              } else {
                a.ring.allreduce(in.data(), out.data(), count, DType::Int32, RedOp::Sum, 1, ctx(seq++),
                                 Deadline::after(milliseconds(20000)));
                for (size_t i = 0; i < count; ++i) {
                  if (in[i] != input_of(r, i, seed)) throw Error("out-of-place allreduce wrote its input");
                }
                outs[r].push_back(out);
              }
            }
          }
        });
        const std::string where = rrtest::message("n=", n, " slot=", slot, " slots=", slots);
        expect_all_ok(res, where);
        if (!res[0].error.empty()) continue;
        size_t k = 0;
        for (size_t count : counts) {
          for (int inplace = 0; inplace < 2; ++inplace, ++k) {
            size_t wrong = 0;
            for (size_t i = 0; i < count; ++i) {
              int64_t want = 0;
              for (int r = 0; r < n; ++r) want += input_of(r, i, seed);
              for (int r = 0; r < n; ++r) wrong += outs[r][k][i] != want;
            }
            RR_EXPECT(wrong == 0, where, " count=", count, " inplace=", inplace, ": ", wrong,
                      " wrong elements");
          }
        }
      }
    }
  }
}

RR_TEST(allreduce_float_is_bit_identical_across_ranks_and_avg_divides) {
  for (int n = 2; n <= 4; ++n) {
    const size_t count = 50021;
    std::vector<std::vector<float>> outs(n), avgs(n);
    auto res = run_group(n, config(1024, 2), [&](int r, Algos& a, ShmTransport&) {
      std::mt19937 rng(1000 + r);
      std::normal_distribution<float> dist;
      std::vector<float> x(count);
      for (auto& v : x) v = dist(rng);
      std::vector<float> y = x;
      a.ring.allreduce(x.data(), x.data(), count, DType::Float32, RedOp::Sum, 1, ctx(0),
                       Deadline::after(milliseconds(20000)));
      a.ring.allreduce(y.data(), y.data(), count, DType::Float32, RedOp::Sum, n, ctx(1),
                       Deadline::after(milliseconds(20000)));
      outs[r] = x;
      avgs[r] = y;
    });
    expect_all_ok(res, rrtest::message("n=", n));
    if (!res[0].error.empty()) continue;
    for (int r = 1; r < n; ++r) {
      RR_EXPECT(std::memcmp(outs[r].data(), outs[0].data(), count * sizeof(float)) == 0, "n=", n,
                ": rank ", r, "'s sum differs bitwise from rank 0's");
      RR_EXPECT(std::memcmp(avgs[r].data(), avgs[0].data(), count * sizeof(float)) == 0, "n=", n,
                ": rank ", r, "'s average differs bitwise from rank 0's");
    }
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += std::abs(avgs[0][i] - outs[0][i] / n) > 1e-6f;
    RR_EXPECT(bad == 0, "n=", n, ": ", bad, " averages are not sum/n");
  }
}

RR_TEST(reduce_scatter_and_all_gather_contiguous_and_as_lists) {
  for (int n = 1; n <= 4; ++n) {
    for (size_t slot : {size_t(64), size_t(4096)}) {
      for (size_t count : {size_t(0), size_t(1), size_t(37), size_t(20011)}) {
        const uint32_t seed = static_cast<uint32_t>(n * 1000 + count);
        // Per rank: reduce-scatter (contiguous, then list form, then averaged), all-gather
        // (contiguous, from its own chunk in place, then list form).
        std::vector<std::vector<std::vector<int32_t>>> got(n);
        auto res = run_group(n, config(slot, 2), [&](int r, Algos& a, ShmTransport&) {
          const auto dl = [] { return Deadline::after(milliseconds(20000)); };
          std::vector<int32_t> in(count * n), out(count, -7);
          for (size_t i = 0; i < in.size(); ++i) in[i] = input_of(r, i, seed);
          a.ring.reduce_scatter(Chunks(in.data(), count * 4), out.data(), count, DType::Int32,
                                RedOp::Sum, 1, ctx(0, "reduce_scatter"), dl());
          got[r].push_back(out);
          std::vector<std::vector<int32_t>> parts(n, std::vector<int32_t>(count));
          std::vector<void*> ptrs;
          for (int c = 0; c < n; ++c) {
            std::copy(in.begin() + c * count, in.begin() + (c + 1) * count, parts[c].begin());
            ptrs.push_back(parts[c].data());
          }
          std::vector<int32_t> out2(count, -7);
          a.ring.reduce_scatter(Chunks(&ptrs), out2.data(), count, DType::Int32, RedOp::Sum, 1,
                                ctx(1, "reduce_scatter"), dl());
          got[r].push_back(out2);
          std::vector<int32_t> avg(count, -7);
          a.ring.reduce_scatter(Chunks(in.data(), count * 4), avg.data(), count, DType::Int32,
                                RedOp::Sum, n, ctx(2, "reduce_scatter"), dl());
          got[r].push_back(avg);

          std::vector<int32_t> mine(count), gathered(count * n, -7);
          for (size_t i = 0; i < count; ++i) mine[i] = input_of(r, i, seed + 1);
          a.ring.all_gather(mine.data(), Chunks(gathered.data(), count * 4), count, DType::Int32,
                            ctx(3, "allgather"), dl());
          got[r].push_back(gathered);
          std::vector<int32_t> inplace(count * n, -7);
          std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
          a.ring.all_gather(inplace.data() + r * count, Chunks(inplace.data(), count * 4), count,
                            DType::Int32, ctx(4, "allgather"), dl());
          got[r].push_back(inplace);
          std::vector<std::vector<int32_t>> outs(n, std::vector<int32_t>(count, -7));
          std::vector<void*> optrs;
          for (auto& o : outs) optrs.push_back(o.data());
          a.ring.all_gather(mine.data(), Chunks(&optrs), count, DType::Int32, ctx(5, "allgather"), dl());
          std::vector<int32_t> flat;
          for (auto& o : outs) flat.insert(flat.end(), o.begin(), o.end());
          got[r].push_back(flat);
        });
        const std::string where = rrtest::message("n=", n, " slot=", slot, " count=", count);
        expect_all_ok(res, where);
        if (!res[0].error.empty()) continue;
        for (int r = 0; r < n; ++r) {
          size_t wrong_rs = 0, wrong_avg = 0, wrong_ag = 0;
          for (size_t i = 0; i < count; ++i) {
            int64_t sum = 0;
            for (int q = 0; q < n; ++q) sum += input_of(q, r * count + i, seed);
            wrong_rs += (got[r][0][i] != sum) + (got[r][1][i] != sum);
            wrong_avg += got[r][2][i] != static_cast<int32_t>(sum / n);
          }
          for (int k = 3; k < 6; ++k) {
            for (int c = 0; c < n; ++c) {
              for (size_t i = 0; i < count; ++i) wrong_ag += got[r][k][c * count + i] != input_of(c, i, seed + 1);
            }
          }
          RR_EXPECT(wrong_rs == 0, where, " rank ", r, ": ", wrong_rs, " wrong reduce_scatter elements");
          RR_EXPECT(wrong_avg == 0, where, " rank ", r, ": ", wrong_avg, " wrong averaged elements");
          RR_EXPECT(wrong_ag == 0, where, " rank ", r, ": ", wrong_ag, " wrong all_gather elements");
        }
      }
    }
  }
}

RR_TEST(reduce_gather_scatter_to_and_from_every_root) {
  for (int n = 1; n <= 4; ++n) {
    for (size_t slot : {size_t(64), size_t(4096)}) {
      for (size_t count : {size_t(0), size_t(1), size_t(37), size_t(20011)}) {
        const uint32_t seed = static_cast<uint32_t>(n * 7919 + count + slot);
        std::vector<std::string> wrong(n);
        auto res = run_group(n, config(slot, 2), [&](int r, Algos& a, ShmTransport&) {
          const auto dl = [] { return Deadline::after(milliseconds(20000)); };
          uint64_t seq = 0;
          for (int root = 0; root < n; ++root) {
            std::vector<int32_t> in(count);
            for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i, seed + root);
            std::vector<int32_t> out(count, -7);
            a.ring.reduce(in.data(), out.data(), count, DType::Int32, RedOp::Sum, 1, root,
                          ctx(seq++, "reduce"), dl());
            if (r == root) {
              for (size_t i = 0; i < count; ++i) {
                int64_t want = 0;
                for (int q = 0; q < n; ++q) want += input_of(q, i, seed + root);
                if (out[i] != want) { wrong[r] += rrtest::message(" reduce root=", root, " i=", i); break; }
              }
            }
            std::vector<int32_t> all(count * n, -7);
            a.star.gather(in.data(), Chunks(all.data(), count * 4), count, DType::Int32, root,
                          ctx(seq++, "gather"), dl());
            if (r == root) {
              for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < count; ++i)
                  if (all[q * count + i] != input_of(q, i, seed + root)) { wrong[r] += rrtest::message(" gather root=", root); q = n; break; }
            }
            std::vector<int32_t> src(count * n), mine(count, -7);
            for (size_t i = 0; i < src.size(); ++i) src[i] = input_of(root, i, seed + 99);
            a.star.scatter(Chunks(src.data(), count * 4), mine.data(), count, DType::Int32, root,
                           ctx(seq++, "scatter"), dl());
            for (size_t i = 0; i < count; ++i)
              if (mine[i] != input_of(root, r * count + i, seed + 99)) { wrong[r] += rrtest::message(" scatter root=", root); break; }
          }
        });
        const std::string where = rrtest::message("n=", n, " slot=", slot, " count=", count);
        expect_all_ok(res, where);
        for (int r = 0; r < n; ++r) RR_EXPECT(wrong[r].empty(), where, " rank ", r, ":", wrong[r]);
      }
    }
  }
}

RR_TEST(alltoall_even_and_uneven_splits) {
  for (int n = 1; n <= 4; ++n) {
    for (size_t slot : {size_t(64), size_t(4096)}) {
      // Rank r sends (r + 2p) % 5 * scale elements to rank p: uneven, sometimes zero.
      for (size_t scale : {size_t(0), size_t(1), size_t(3001)}) {
        auto cnt = [&](int from, int to) { return static_cast<size_t>((from + 2 * to) % 5) * scale; };
        std::vector<std::string> wrong(n);
        auto res = run_group(n, config(slot, 2), [&](int r, Algos& a, ShmTransport&) {
          std::vector<size_t> sc(n), rc(n);
          std::vector<std::vector<int32_t>> in(n), out(n);
          std::vector<void*> ip, op;
          for (int p = 0; p < n; ++p) {
            sc[p] = cnt(r, p);
            rc[p] = cnt(p, r);
            in[p].resize(sc[p]);
            for (size_t i = 0; i < sc[p]; ++i) in[p][i] = input_of(r, p * 100000 + i, 5);
            out[p].assign(rc[p], -7);
            ip.push_back(in[p].data());
            op.push_back(out[p].data());
          }
          a.pairwise.alltoall(Chunks(&ip), sc, Chunks(&op), rc, DType::Int32, ctx(0, "alltoall"),
                              Deadline::after(milliseconds(20000)));
          for (int p = 0; p < n; ++p)
            for (size_t i = 0; i < rc[p]; ++i)
              if (out[p][i] != input_of(p, r * 100000 + i, 5)) { wrong[r] += rrtest::message(" from ", p, " i=", i); break; }
        });
        const std::string where = rrtest::message("n=", n, " slot=", slot, " scale=", scale);
        expect_all_ok(res, where);
        for (int r = 0; r < n; ++r) RR_EXPECT(wrong[r].empty(), where, " rank ", r, ":", wrong[r]);
      }
    }
  }
}

RR_TEST(alltoall_with_disagreeing_splits_fails_on_both_sides) {
  auto res = run_group(2, config(4096, 2), [&](int r, Algos& algos, ShmTransport&) {
    std::vector<int32_t> a(100), b(120);  // b: two chunks of 60, the larger count
    // Rank 0 sends 50 to rank 1, which expects 60.
    std::vector<size_t> sc = {50, 50}, rc = {r == 1 ? size_t(60) : size_t(50), 50};
    if (r == 1) sc = {50, 50};
    algos.pairwise.alltoall(Chunks(a.data(), 200), sc, Chunks(b.data(), 240), rc, DType::Int32,
                            ctx(3, "alltoall"), Deadline::after(milliseconds(20000)));
  });
  RR_EXPECT(!res[1].error.empty() && res[1].error.find("alltoall #3") != std::string::npos, res[1].error);
  RR_EXPECT(!res[0].error.empty(), "rank 0 did not fail");
}

RR_TEST(broadcast_from_every_root_and_barrier) {
  for (int n = 1; n <= 4; ++n) {
    for (size_t count : {size_t(0), size_t(1), size_t(777), size_t(70001)}) {
      std::vector<std::vector<std::vector<uint8_t>>> got(n);
      auto res = run_group(n, config(256, 2), [&](int r, Algos& a, ShmTransport&) {
        for (int root = 0; root < n; ++root) {
          std::vector<uint8_t> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = static_cast<uint8_t>(r == root ? i * 7 + root : 0xEE);
          a.chain.broadcast(buf.data(), count, DType::UInt8, root, ctx(2 * root, "broadcast"),
                            Deadline::after(milliseconds(20000)));
          a.ring.barrier(ctx(2 * root + 1, "barrier"), Deadline::after(milliseconds(20000)));
          got[r].push_back(buf);
        }
      });
      expect_all_ok(res, rrtest::message("n=", n, " count=", count));
      if (!res[0].error.empty()) continue;
      for (int r = 0; r < n; ++r) {
        for (int root = 0; root < n; ++root) {
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) wrong += got[r][root][i] != static_cast<uint8_t>(i * 7 + root);
          RR_EXPECT(wrong == 0, "n=", n, " count=", count, " root=", root, " rank=", r, ": ", wrong,
                    " wrong bytes");
        }
      }
    }
  }
}

RR_TEST(mismatched_counts_fail_on_every_rank_and_leave_inputs_alone) {
  for (int n = 2; n <= 4; ++n) {
    const int odd = n - 1;  // this rank calls with a different count
    std::vector<int> untouched(n, 0);
    auto res = run_group(n, config(4096, 2), [&](int r, Algos& a, ShmTransport&) {
      const size_t count = r == odd ? 3000 : 5000;
      std::vector<int32_t> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = input_of(r, i, 1);
      try {
        a.ring.allreduce(x.data(), x.data(), count, DType::Int32, RedOp::Sum, 1, ctx(0),
                         Deadline::after(milliseconds(20000)));
      } catch (...) {
        bool same = true;
        for (size_t i = 0; i < count; ++i) same &= x[i] == input_of(r, i, 1);
        untouched[r] = same;
        throw;
      }
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(!res[r].error.empty(), "n=", n, ": rank ", r, " did not fail");
      RR_EXPECT(!res[r].timeout, "n=", n, ": rank ", r, " timed out instead of failing fast: ",
                res[r].error);
      RR_EXPECT(res[r].error.find("allreduce #0") != std::string::npos, "n=", n, ": rank ", r,
                "'s error does not name the op: ", res[r].error);
      RR_EXPECT(res[r].error.find("3000") != std::string::npos &&
                    res[r].error.find("5000") != std::string::npos,
                "n=", n, ": rank ", r, "'s error does not say how the counts differ: ", res[r].error);
      RR_EXPECT(untouched[r], "n=", n, ": rank ", r, "'s tensor was modified by the failed op");
      RR_EXPECT(res[r].seconds < 10, "n=", n, ": rank ", r, " took ", res[r].seconds, " s to fail");
    }
  }
}

RR_TEST(absent_rank_times_out_with_its_name_and_the_deadline) {
  const int n = 3;
  std::atomic<int> ended{0};
  auto res = run_group(n, config(4096, 2), [&](int r, Algos& a, ShmTransport&) {
    if (r == 2) {
      // Never calls the collective, but stays (its transport, and so its liveness lock, with
      // it) until the others have given up, as an absent process would.
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (ended.load() < 2 && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
      return;
    }
    struct End {
      std::atomic<int>& n;
      ~End() { n.fetch_add(1); }
    } end{ended};
    std::vector<float> x(1000, 1.0f);
    OpContext c = ctx(4);
    c.timeout = milliseconds(300);
    a.ring.allreduce(x.data(), x.data(), x.size(), DType::Float32, RedOp::Sum, 1, c,
                     Deadline::after(milliseconds(300)));
  });
  RR_EXPECT(res[2].error.empty(), res[2].error);
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    RR_EXPECT(res[r].timeout || res[r].aborted, "rank ", r, " did not fail: ", res[r].error);
    RR_EXPECT(res[r].error.find("allreduce #4") != std::string::npos, res[r].error);
    RR_EXPECT(res[r].seconds < 5, "rank ", r, " took ", res[r].seconds, " s");
    named |= res[r].error.find("rank 2 has not arrived at this op") != std::string::npos;
  }
  RR_EXPECT(named, "no error names the absent rank 2: ", res[0].error, " | ", res[1].error);
  // Rank 2 ran no op, so its op_seq says so; the errors say which op it missed.
  RR_EXPECT(res[0].error.find("it has run no op yet") != std::string::npos, res[0].error);
}

RR_TEST(abort_from_another_thread_ends_a_waiting_op) {
  const int n = 2;
  auto res = run_group(n, config(4096, 2), [&](int r, Algos& a, ShmTransport& t) {
    if (r == 1) {
      // Rank 1 never joins; it aborts the group while rank 0 waits for it.
      std::thread aborter([&t] {
        std::this_thread::sleep_for(milliseconds(200));  // sleep-ok: lets rank 0 reach its wait
        t.abort_group("test abort");
      });
      aborter.join();
      return;
    }
    std::vector<float> x(1000, 1.0f);
    a.ring.allreduce(x.data(), x.data(), x.size(), DType::Float32, RedOp::Sum, 1, ctx(0),
                     Deadline::after(milliseconds(20000)));
  });
  RR_EXPECT(res[0].aborted, "rank 0 was not aborted: ", res[0].error);
  RR_EXPECT(res[0].error.find("test abort") != std::string::npos, res[0].error);
  RR_EXPECT(res[0].seconds < 5, "abort took ", res[0].seconds, " s to end the op");
}

RR_TEST(segments_are_unlinked_once_every_peer_mapped_them) {
  for (int n = 1; n <= 4; ++n) {
    std::atomic<int> linked{0};
    auto res = run_group(n, config(4096, 2), [&](int, Algos&, ShmTransport& t) {
      // Ask the file system, not the transport's own bookkeeping.
      const int fd = shm_open(t.segment_name().c_str(), O_RDONLY, 0);
      if (fd >= 0) {
        close(fd);
        ++linked;
      } else if (errno != ENOENT) {
        throw Error("shm_open failed other than with ENOENT");
      }
      linked += static_cast<int>(t.linked_segments().size());
    });
    expect_all_ok(res, rrtest::message("n=", n));
    RR_EXPECT(linked == 0, "n=", n, ": ", linked.load(), " segments still linked after set-up");
  }
}

RR_TEST(a_group_set_up_again_on_the_same_store_uses_fresh_keys) {
  // Two incarnations of a 3-rank group on one store, one after the other: the second must not
  // read the first one's token or names.
  MapBootstrap bs;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        try {
          ShmTransport t(bs, incarnation_prefix(bs, r, 3, kJoinTimeout), r, 3, config(4096, 2));
          Messages msgs(t, 4096);
          Ring ring(msgs);
          std::vector<int32_t> x(100, r + 1);
          ring.allreduce(x.data(), x.data(), x.size(), DType::Int32, RedOp::Sum, 1, ctx(0),
                         Deadline::after(milliseconds(20000)));
          if (x[0] != 6 || x[99] != 6) throw Error("wrong sum");
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) RR_EXPECT(errors[r].empty(), "round ", round, " rank ", r, ": ", errors[r]);
  }
}

// A spin is as long as it is set to: the clock is read every kPollsPerClockRead polls, so a spin
// of a nanosecond polls no more than that many times, and one of none polls once. With a clock
// read every 64 polls (30-40 ns each on some CPUs), the 1 us spin of oversubscribed groups lasted
// over 2 us per wait, and no setting could make it shorter.
RR_TEST(a_spin_reads_the_clock_often_enough_to_end_when_it_should) {
  unsigned polls = 0;
  auto never = [&] {
    ++polls;
    return false;
  };
  RR_EXPECT(!spin_until(never, std::chrono::nanoseconds(0)), "a spin of none came true");
  RR_EXPECT(polls == 1, "a spin of none polled ", polls, " times");
  polls = 0;
  RR_EXPECT(!spin_until(never, std::chrono::nanoseconds(1)), "a spin of 1 ns came true");
  RR_EXPECT(polls >= 1 && polls <= kPollsPerClockRead, "a spin of 1 ns polled ", polls, " times");
  polls = 0;
  RR_EXPECT(spin_until([&] { return ++polls == 3; }, std::chrono::seconds(10)), "a spin missed ready()");
  RR_EXPECT(polls == 3, "a spin polled ", polls, " times for a ready() true on the third");
}

// The pages a rank reads across in its peers' windows are mapped at set-up, not by faults in the
// middle of its first ops (ShmTransport::populate).
RR_TEST(peers_windows_are_mapped_before_the_first_op) {
  ShmConfig cfg = config(4096, 2);
  cfg.window_bytes = 64 << 10;
  std::vector<size_t> unmapped(3, 1);
  auto res = run_group(3, cfg, [&](int r, Algos&, ShmTransport& t) {
    unmapped[r] = 0;
    for (int p = 0; p < 3; ++p) {
      if (p != r) unmapped[r] += t.unmapped_window_pages(p);
    }
  });
  expect_all_ok(res, "three ranks");
  for (int r = 0; r < 3; ++r) RR_EXPECT(unmapped[r] == 0, "rank ", r, ": ", unmapped[r], " pages of its peers' windows unmapped");
}

// Two ranks that the scheduler put on one CPU: a rank that spun for its peer would hold the CPU
// the peer needs for a whole time slice at every hand-off. The waits see the peer's CPU is their
// own and yield it instead of spinning (however long the spin is set to).
RR_TEST(a_peer_on_the_same_cpu_is_yielded_to_not_spun_for) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  ShmConfig cfg = config(4096, 2);
  cfg.spin = std::chrono::seconds(1);
  std::vector<uint64_t> yields(2, 0);
  auto res = run_group(2, cfg, [&](int r, Algos& a, ShmTransport& t) {
    RR_REQUIRE(pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0, "cannot pin rank ", r);
    std::vector<int32_t> buf(1000);
    for (uint64_t k = 0; k < 50; ++k) {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = input_of(r, i, static_cast<uint32_t>(k));
      a.ring.allreduce(buf.data(), buf.data(), buf.size(), DType::Int32, RedOp::Sum, 1, ctx(k),
                       Deadline::after(milliseconds(20000)));
      for (size_t i = 0; i < buf.size(); ++i) {
        RR_REQUIRE(buf[i] == input_of(0, i, static_cast<uint32_t>(k)) + input_of(1, i, static_cast<uint32_t>(k)),
                   "op ", k, " element ", i);
      }
    }
    yields[r] = t.yields_to_peer();
  });
  expect_all_ok(res, "two ranks on one CPU");
  RR_EXPECT(yields[0] + yields[1] > 0, "no rank yielded to a peer on its own CPU");
}

RR_TEST(one_slot_per_link_is_rejected_because_the_ring_would_deadlock) {
  auto res = run_group(2, config(4096, 1), [](int, Algos&, ShmTransport&) {});
  for (const auto& r : res) RR_EXPECT(r.error.find("slots per link") != std::string::npos, r.error);
}

RR_TEST_MAIN()

// The hierarchical all-reduce (csrc/algo/hierarchical.h) with threads as ranks over the
// shared-memory transport, its "hosts" cut by HostLayout::split: exact integer sums and AVG for
// layouts of 2x2, 2x3 and 3x2 ranks, in place and not, the same bits on every rank, and the host
// layouts it refuses. The sanitizer builds see every access of its three phases.
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "algo/hierarchical.h"
#include "common/error.h"
#include "map_bootstrap.h"
#include "rrtest.h"
#include "transport/hosts.h"
#include "transport/shm/shm_transport.h"

using namespace ringreduce;
using std::chrono::milliseconds;

namespace {

std::vector<std::string> run_group(int n, const HostLayout& hosts,
                                   const std::function<void(int, Hierarchical&, Messages&)>& fn) {
  MapBootstrap bs;
  ShmConfig cfg;
  cfg.slot_bytes = 4096;  // small slices: each phase runs many of them
  cfg.nslots = 2;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmTransport t(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, cfg);
        Hierarchical h(t, hosts, cfg.slot_bytes, true);
        Messages msgs(t, cfg.slot_bytes);
        fn(r, h, msgs);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

OpContext ctx(uint64_t seq) {
  OpContext c;
  c.name = "allreduce";
  c.seq = seq;
  c.timeout = milliseconds(20000);
  return c;
}

MsgHeader fp(const Messages& msgs, uint64_t seq, size_t count, DType t, RedOp op, int64_t divisor) {
  return msgs.fingerprint(ctx(seq), OpKind::Allreduce, count, t, Messages::redop_code(op, divisor), -1);
}

int32_t input_of(int rank, size_t i) {
  return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(rank) * 40503u) % 2001) - 1000;
}

}  // namespace

RR_TEST(sums_int32_exactly_in_every_layout) {
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
    const int n = hosts * per_host;
    std::vector<std::string> bad(n);
    auto errors = run_group(n, HostLayout::split(n, hosts), [&](int r, Hierarchical& h, Messages& msgs) {
      uint64_t seq = 0;
      for (size_t count : {size_t(0), size_t(1), size_t(per_host - 1), size_t(1009), size_t(70001)}) {
        for (bool in_place : {false, true}) {
          std::vector<int32_t> in(count), out(count, 7);
          for (size_t i = 0; i < count; ++i) in[i] = input_of(r, i);
          int32_t* dst = in_place ? in.data() : out.data();
          h.allreduce(in.data(), dst, count, DType::Int32, RedOp::Sum, 1,
                      fp(msgs, seq, count, DType::Int32, RedOp::Sum, 1), ctx(seq),
                      Deadline::after(milliseconds(20000)));
          ++seq;
          for (size_t i = 0; i < count && bad[r].empty(); ++i) {
            int32_t want = 0;
            for (int p = 0; p < n; ++p) want += input_of(p, i);
            if (dst[i] != want) {
              bad[r] = rrtest::message("count=", count, " in_place=", in_place, " i=", i, " got ", dst[i],
                                       " want ", want);
            }
          }
        }
      }
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(errors[r].empty() && bad[r].empty(), hosts, "x", per_host, " rank ", r, ": ", errors[r], bad[r]);
    }
  }
}

RR_TEST(avg_of_floats_gives_the_same_bits_on_every_rank) {
  const int n = 4;
  const size_t count = 20011;
  std::vector<std::vector<float>> got(n, std::vector<float>(count));
  auto errors = run_group(n, HostLayout::split(n, 2), [&](int r, Hierarchical& h, Messages& msgs) {
    std::vector<float>& buf = got[r];
    for (size_t i = 0; i < count; ++i) buf[i] = 0.1f * static_cast<float>(input_of(r, i)) + 1e-3f * r;
    h.allreduce(buf.data(), buf.data(), count, DType::Float32, RedOp::Sum, n,
                fp(msgs, 0, count, DType::Float32, RedOp::Sum, n), ctx(0), Deadline::after(milliseconds(20000)));
  });
  for (int r = 0; r < n; ++r) RR_EXPECT(errors[r].empty(), "rank ", r, ": ", errors[r]);
  for (int r = 1; r < n; ++r) {
    RR_EXPECT(std::memcmp(got[r].data(), got[0].data(), count * sizeof(float)) == 0, "rank ", r,
              " has other bits than rank 0");
  }
  for (size_t i = 0; i < count; i += 997) {
    double want = 0;
    for (int p = 0; p < n; ++p) want += 0.1f * static_cast<float>(input_of(p, i)) + 1e-3f * p;
    want /= n;
    RR_EXPECT(std::abs(got[0][i] - want) < 1e-3, "i=", i, " got ", got[0][i], " want ", want);
  }
}

RR_TEST(host_layouts) {
  const HostLayout l = HostLayout::split(6, 2);
  RR_EXPECT(l.hosts() == 2 && l.per_host() == 3, l.describe());
  RR_EXPECT(l.host_of(2) == 0 && l.host_of(3) == 1, l.describe());
  RR_EXPECT(l.describe() == "2 hosts x 3 ranks", l.describe());
  const HostLayout uneven = HostLayout::split(5, 2);
  RR_EXPECT(uneven.per_host() == 0 && uneven.describe() == "2 hosts of 3 and 2 ranks", uneven.describe());
  RR_EXPECT(HostLayout().describe() == "one host", HostLayout().describe());
  RR_EXPECT_THROWS(HostLayout::split(4, 5), "RINGREDUCE_FAKE_HOSTS=5");
  RR_EXPECT_THROWS(HostLayout::split(4, 0), "RINGREDUCE_FAKE_HOSTS=0");
  // One rank per host, or hosts of different sizes: no hierarchy to build.
  auto errors = run_group(4, HostLayout::split(4, 4), [](int, Hierarchical&, Messages&) {});
  for (const std::string& e : errors) RR_EXPECT(e.find("several hosts with as many ranks") != std::string::npos, e);
}

RR_TEST(agreeing_on_hosts_from_the_probe) {
  // Ranks {0,1} and {2,3} see each other; the probe of a group with a one-way pair does not agree.
  for (bool agreeing : {true, false}) {
    MapBootstrap bs;
    std::vector<HostLayout> got(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        std::vector<uint8_t> local(4, 0);
        local[static_cast<size_t>(r ^ 1)] = 1;
        if (!agreeing && r == 3) local[0] = 1;  // rank 3 alone thinks it shares rank 0's host
        got[r] = HostLayout::agree(bs, "g/", r, 4, local);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r) {
      RR_EXPECT(got[r].describe() == (agreeing ? "2 hosts x 2 ranks" : "one host"), "agreeing=", agreeing,
                " rank ", r, ": ", got[r].describe());
    }
  }
}

RR_TEST_MAIN()

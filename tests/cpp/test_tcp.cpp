// The TCP transport on loopback, with threads as ranks: the ring over TCP alone and over a mix of
// shared-memory and TCP hops, connections that fail the handshake (garbage, truncated hellos,
// wrong secrets) while a job runs, a peer whose connection dies, and the frame checks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "map_bootstrap.h"
#include "algo/messages.h"
#include "algo/ring.h"
#include "rrtest.h"
#include "transport/routed.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/tcp/wire.h"

using namespace ringreduce;
using std::chrono::milliseconds;

namespace {

OpContext ctx(uint64_t seq) {
  OpContext c;
  c.name = "allreduce";
  c.seq = seq;
  c.timeout = milliseconds(20000);
  return c;
}

int32_t input_of(int rank, size_t i, uint32_t seed) {
  return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(rank) * 40503u + seed) % 2001) - 1000;
}

// One rank's transports: shared memory between ranks of the same "host" (host_of), TCP between
// the others, and the routed transport over both.
struct RankTransports {
  std::unique_ptr<ShmTransport> shm;
  std::unique_ptr<TcpTransport> tcp;
  std::unique_ptr<RoutedTransport> routed;
};

RankTransports make_transports(MapBootstrap& bs, const std::string& prefix, int r, int n,
                               const std::vector<int>& host_of, size_t slot, uint32_t sockets) {
  RankTransports t;
  std::vector<uint8_t> local(n, 0), remote(n, 0);
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    (host_of[p] == host_of[r] ? local : remote)[p] = 1;
  }
  ShmConfig sc;
  sc.slot_bytes = slot;
  sc.nslots = 3;
  t.shm = std::make_unique<ShmTransport>(bs, prefix, r, n, sc, ShmTransport::Reach::Require, local);
  TcpConfig tc;
  tc.slot_bytes = slot;
  tc.nslots = 3;
  tc.sockets = sockets;
  tc.listen_address = "127.0.0.1";
  tc.connect_timeout = milliseconds(20000);
  t.tcp = std::make_unique<TcpTransport>(bs, prefix, r, n, tc, remote, TcpHooks::beside(t.shm.get()));
  std::vector<int8_t> route(n, 0);
  for (int p = 0; p < n; ++p) route[p] = p == r ? -1 : remote[p] ? 1 : 0;
  t.routed = std::make_unique<RoutedTransport>(r, n, std::vector<Transport*>{t.shm.get(), t.tcp.get()},
                                               route);
  return t;
}

// Runs fn on n threads; returns each rank's error ("" if none).
std::vector<std::string> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void allreduce_checks(Ring& ring, int r, int n, uint32_t seed, uint64_t& seq) {
  for (size_t count : {size_t(0), size_t(1), size_t(n + 1), size_t(1009), size_t(300007)}) {
    std::vector<int32_t> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = input_of(r, i, seed);
    ring.allreduce(x.data(), x.data(), count, DType::Int32, RedOp::Sum, 1, ctx(seq),
                   Deadline::after(milliseconds(20000)));
    ++seq;
    for (size_t i = 0; i < count; ++i) {
      int32_t want = 0;
      for (int q = 0; q < n; ++q) want += input_of(q, i, seed);
      if (x[i] != want) {
        throw Error(detail::cat("rank ", r, " count ", count, ": element ", i, " is ", x[i], ", want ", want));
      }
    }
  }
}

// A raw client of a rank's listener.
int dial(const std::string& where) {
  const size_t colon = where.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(where.substr(colon + 1))));
  inet_pton(AF_INET, where.substr(0, colon).c_str(), &a.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    throw Error("test: cannot connect to " + where);
  }
  return fd;
}

}  // namespace

RR_TEST(allreduce_over_tcp_alone_and_over_mixed_hops) {
  struct Layout {
    std::vector<int> host_of;
    uint32_t sockets;
  };
  const std::vector<Layout> layouts = {
      {{0, 1}, 1}, {{0, 1}, 3}, {{0, 1, 2}, 2}, {{0, 0, 1, 1}, 2}, {{0, 1, 1, 0}, 1}, {{0, 0, 0, 1}, 2}};
  uint32_t seed = 11;
  for (const auto& l : layouts) {
    const int n = static_cast<int>(l.host_of.size());
    MapBootstrap bs;
    const auto errors = run_ranks(n, [&](int r) {
      RankTransports t = make_transports(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, l.host_of, 4096, l.sockets);
      Messages msgs(*t.routed, 4096);
      Ring ring(msgs);
      uint64_t seq = 0;
      allreduce_checks(ring, r, n, seed, seq);
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(errors[r].empty(), "world ", n, " sockets ", l.sockets, ": rank ", r, ": ", errors[r]);
    }
    ++seed;
  }
}

// How many all-gather messages rank r receives from its predecessor with a non-empty payload, in
// a ring all-reduce (or all-gather) whose chunks are `chunk` elements cut in slices of `slice`.
uint64_t gather_messages(size_t count, size_t chunk, size_t slice, int n, int r) {
  const size_t nslices = std::max<size_t>(1, (chunk + slice - 1) / slice);
  uint64_t m = 0;
  for (size_t j = 0; j < nslices; ++j) {
    for (int s = 1; s < n; ++s) {
      const size_t c = static_cast<size_t>(((r - s) % n + n) % n);
      const size_t begin = std::min(count, c * chunk);
      const size_t len = std::min(count - begin, chunk);
      if (std::min(len, j * slice) < len) ++m;
    }
  }
  return m;
}

RR_TEST(receives_over_tcp_land_in_place_and_only_when_their_header_is_right) {
  // Every all-gather message from a TCP predecessor is read straight into the output (in-place and
  // out-of-place all-reduce, all-gather); the results are exact; and a desynchronised op lands
  // nothing and leaves the caller's buffer as it was.
  struct Layout {
    std::vector<int> host_of;
    uint32_t sockets;
  };
  const std::vector<Layout> layouts = {{{0, 1}, 1}, {{0, 1}, 3}, {{0, 1, 2}, 2}, {{0, 0, 1, 1}, 2}};
  const size_t slot = 4096, slice = slot / 4;
  for (const auto& l : layouts) {
    const int n = static_cast<int>(l.host_of.size());
    MapBootstrap bs;
    std::atomic<int> done_with_good_ops{0};
    const auto errors = run_ranks(n, [&](int r) {
      RankTransports t = make_transports(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, l.host_of, slot, l.sockets);
      Messages msgs(*t.routed, slot);
      Ring ring(msgs);
      const int prev = (r + n - 1) % n;
      const bool tcp_prev = l.host_of[prev] != l.host_of[r];
      uint64_t seq = 0, want = 0;
      for (size_t count : {size_t(1), size_t(3001), size_t(40000)}) {
        std::vector<int32_t> x(count), y(count, -7);
        for (size_t i = 0; i < count; ++i) x[i] = input_of(r, i, 9);
        const size_t chunk = (count + n - 1) / n;
        for (int in_place = 0; in_place < 2; ++in_place) {
          std::vector<int32_t> in = x;
          int32_t* out = in_place ? in.data() : y.data();
          ring.allreduce(in.data(), out, count, DType::Int32, RedOp::Sum, 1, ctx(seq++),
                         Deadline::after(milliseconds(20000)));
          if (tcp_prev) want += gather_messages(count, chunk, slice, n, r);
          for (size_t i = 0; i < count; ++i) {
            int32_t sum = 0;
            for (int q = 0; q < n; ++q) sum += input_of(q, i, 9);
            if (out[i] != sum) {
              throw Error(detail::cat("allreduce of ", count, (in_place ? " in place" : ""),
                                      ": element ", i, " is ", out[i], ", want ", sum));
            }
          }
        }
        if (t.tcp->landed_messages() != want) {
          throw Error(detail::cat("all-reduces of ", count, ": ", t.tcp->landed_messages(),
                                  " messages landed in place, want ", want));
        }
        // An all-gather's first messages leave the predecessor at once, and up to a link's slots
        // of them may be read before this rank has entered the op: those go to their slot.
        std::vector<int32_t> gathered(count * n, -1);
        ring.all_gather(x.data(), Chunks(gathered.data(), count * 4), count, DType::Int32, ctx(seq++),
                        Deadline::after(milliseconds(20000)));
        if (tcp_prev) {
          const uint64_t most = gather_messages(count * n, count, slice, n, r);
          const uint64_t landed = t.tcp->landed_messages() - want;
          if (landed > most || landed + 3 < most) {
            throw Error(detail::cat("all_gather of ", count, ": ", landed, " of ", most,
                                    " messages landed in place"));
          }
          want += landed;
        }
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < count; ++i) {
            if (gathered[q * count + i] != input_of(q, i, 9)) {
              throw Error(detail::cat("all_gather of ", count, ": chunk ", q, " element ", i, " is ",
                                      gathered[q * count + i]));
            }
          }
        }
      }
      // Ranks disagree on the size: every rank fails, and nothing lands in their buffers. (Once
      // every rank is out of the ops before, so that the abort cannot reach one still in them.)
      ++done_with_good_ops;
      while (done_with_good_ops.load() < n) std::this_thread::yield();
      std::vector<int32_t> z(20000 + 1000 * r, 5);
      const auto t0 = Clock::now();
      bool failed = false;
      try {
        ring.allreduce(z.data(), z.data(), z.size(), DType::Int32, RedOp::Sum, 1, ctx(seq++),
                       Deadline::after(milliseconds(20000)));
      } catch (const std::exception&) {
        failed = true;
      }
      if (!failed) throw Error("an all-reduce of different sizes did not fail");
      if (Clock::now() - t0 > std::chrono::seconds(5)) {
        throw Error("an all-reduce of different sizes took more than 5 s to fail");
      }
      for (int32_t v : z) {
        if (v != 5) throw Error("a failed all-reduce changed its buffer");
      }
      if (t.tcp->landed_messages() != want) {
        throw Error(detail::cat("a failed all-reduce landed ", t.tcp->landed_messages() - want,
                                " messages"));
      }
    });
    for (int r = 0; r < n; ++r) {
      RR_EXPECT(errors[r].empty(), "world ", n, " sockets ", l.sockets, ": rank ", r, ": ", errors[r]);
    }
  }
}

RR_TEST(bad_connections_are_dropped_and_the_job_goes_on) {
  const int n = 2;
  MapBootstrap bs;
  std::atomic<int> phase{0};
  std::string listener;
  std::atomic<uint64_t> rejected{0};
  const auto errors = run_ranks(n, [&](int r) {
    RankTransports t = make_transports(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, {0, 1}, 4096, 2);
    Messages msgs(*t.routed, 4096);
    Ring ring(msgs);
    uint64_t seq = 0;
    allreduce_checks(ring, r, n, 5, seq);
    if (r == 0) {
      listener = t.tcp->address();
      phase = 1;
      while (phase.load() != 2) std::this_thread::yield();
    } else {
      while (phase.load() != 1) std::this_thread::yield();
      // Garbage; a truncated hello; a well-formed hello with the wrong secret; a hello claiming
      // to be rank 1 (who is connected already) with a wrong secret; an abrupt close.
      std::mt19937 rng(3);
      std::vector<uint8_t> junk(5000);
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      int fd = dial(listener);
      send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
      close(fd);
      tcp::Hello h;
      h.rank = 1;
      h.world = 2;
      h.sockets = 2;
      fd = dial(listener);
      send(fd, &h, 20, MSG_NOSIGNAL);
      close(fd);
      fd = dial(listener);
      send(fd, &h, sizeof h, MSG_NOSIGNAL);
      uint8_t answer[64];
      const ssize_t got = recv(fd, answer, sizeof answer, 0);  // dropped: EOF, no answer
      close(fd);
      if (got > 0) throw Error("the listener answered a hello with a wrong secret");
      fd = dial(listener);
      close(fd);
      phase = 2;
    }
    // The job is unaffected.
    allreduce_checks(ring, r, n, 6, seq);
    if (r == 0) {
      // Four connections went bad; the last closed before saying anything may still be pending.
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (t.tcp->rejected_connections() < 4 && Clock::now() < until) std::this_thread::yield();
      rejected = t.tcp->rejected_connections();
    }
  });
  for (int r = 0; r < n; ++r) RR_EXPECT(errors[r].empty(), "rank ", r, ": ", errors[r]);
  RR_EXPECT(rejected.load() >= 4, "the listener counted ", rejected.load(), " rejected connections");
}

RR_TEST(a_peer_that_goes_away_mid_op_fails_the_others_naming_it) {
  // Rank 2 leaves (its transports are destroyed: a Bye, then closed sockets) while ranks 0 and 1
  // wait for it in an all-reduce: they fail at once, long before the 20 s deadline, naming rank 2.
  const int n = 3;
  MapBootstrap bs;
  std::vector<double> seconds(n, 0);
  const auto errors = run_ranks(n, [&](int r) {
    RankTransports t = make_transports(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, {0, 1, 2}, 4096, 1);
    Messages msgs(*t.routed, 4096);
    Ring ring(msgs);
    uint64_t seq = 0;
    allreduce_checks(ring, r, n, 9, seq);
    if (r == 2) return;
    std::vector<int32_t> x(100000, 1);
    const auto start = Clock::now();
    try {
      ring.allreduce(x.data(), x.data(), x.size(), DType::Int32, RedOp::Sum, 1, ctx(seq),
                     Deadline::after(milliseconds(20000)));
    } catch (...) {
      seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
      throw;
    }
  });
  RR_EXPECT(errors[2].empty(), "rank 2: ", errors[2]);
  for (int r = 0; r < 2; ++r) {
    RR_EXPECT(errors[r].find("rank 2") != std::string::npos && errors[r].find("allreduce #") != std::string::npos,
              "rank ", r, ": ", errors[r]);
    RR_EXPECT(seconds[r] < 10, "rank ", r, " took ", seconds[r], " s to notice");
  }
}

RR_TEST(an_absent_rank_is_named_by_every_waiting_rank_across_hosts) {
  // The last rank never calls the all-reduce. The others wait in a chain (each for its left
  // neighbour), partly over TCP, and whichever times out first follows the chain by asking its
  // peers where they stand: every waiting rank's error names the absent one.
  const std::vector<std::vector<int>> layouts = {{0, 1, 2}, {0, 1, 2, 3}, {0, 0, 1, 1}, {0, 1, 1, 0}};
  for (const auto& host_of : layouts) {
    const int n = static_cast<int>(host_of.size());
    const int absent = n - 1;
    MapBootstrap bs;
    std::atomic<int> done{0};
    std::vector<double> seconds(n, 0);
    const auto errors = run_ranks(n, [&](int r) {
      RankTransports t = make_transports(bs, incarnation_prefix(bs, r, n, kJoinTimeout), r, n, host_of, 4096, 2);
      Messages msgs(*t.routed, 4096);
      Ring ring(msgs);
      uint64_t seq = 0;
      allreduce_checks(ring, r, n, 3, seq);
      if (r == absent) {
        // Alive, with its transports answering, but not in the op.
        while (done.load() != n - 1) std::this_thread::yield();
        return;
      }
      std::vector<int32_t> x(100000, 1);
      OpContext c = ctx(seq);
      c.timeout = milliseconds(500);
      const auto start = Clock::now();
      try {
        ring.allreduce(x.data(), x.data(), x.size(), DType::Int32, RedOp::Sum, 1, c,
                       Deadline::after(c.timeout));
      } catch (...) {
        seconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
        ++done;
        throw;
      }
      ++done;
    });
    for (int r = 0; r < n; ++r) {
      if (r == absent) {
        RR_EXPECT(errors[r].empty(), "rank ", r, ": ", errors[r]);
        continue;
      }
      RR_EXPECT(errors[r].find(detail::cat("rank ", absent, " has not arrived at this op")) != std::string::npos &&
                    errors[r].find("allreduce #5") != std::string::npos,
                "hosts ", host_of[0], host_of[1], host_of[2], n > 3 ? host_of[3] : -1, ": rank ", r,
                ": ", errors[r]);
      RR_EXPECT(seconds[r] < 5, "rank ", r, " took ", seconds[r], " s");
    }
  }
}

RR_TEST(frame_and_hello_checks) {
  tcp::HelloExpect e;
  e.world = 4;
  e.sockets = 2;
  e.group = tcp::group_id("g/");
  e.slot_bytes = 4096;
  for (size_t i = 0; i < tcp::kSecretBytes; ++i) e.secret[i] = static_cast<uint8_t>(i * 7);
  tcp::Hello h;
  h.rank = 3;
  h.world = 4;
  h.socket = 1;
  h.sockets = 2;
  h.group = e.group;
  h.slot_bytes = 4096;
  std::memcpy(h.secret, e.secret, sizeof h.secret);
  tcp::Hello out;
  RR_EXPECT(tcp::check_hello(&h, sizeof h, e, &out).empty(), "a good hello is refused");
  RR_EXPECT(!tcp::check_hello(&h, sizeof h - 1, e, &out).empty(), "a short hello is accepted");
  auto bad = [&](auto mutate, const char* what) {
    tcp::Hello b = h;
    mutate(b);
    const std::string why = tcp::check_hello(&b, sizeof b, e, &out);
    RR_EXPECT(why.find(what) != std::string::npos, "got '", why, "', expected '", what, "'");
  };
  bad([](tcp::Hello& b) { b.magic ^= 1; }, "magic");
  bad([](tcp::Hello& b) { b.secret[5] ^= 1; }, "secret");
  bad([](tcp::Hello& b) { b.group ^= 1; }, "another process group");
  bad([](tcp::Hello& b) { b.rank = 4; }, "outside");
  bad([](tcp::Hello& b) { b.rank = -1; }, "outside");
  bad([](tcp::Hello& b) { b.socket = 2; }, "socket");
  bad([](tcp::Hello& b) { b.slot_bytes = 8192; }, "slots");
  tcp::FrameHead f;
  f.type = 1;
  f.len = 32 + 4096;
  RR_EXPECT(tcp::check_frame_head(f, 4096).empty(), "a full data frame is refused");
  f.len = 32 + 4097;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "an oversized data frame is accepted");
  f.len = 31;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "a data frame shorter than its header is accepted");
  f.type = 2;
  f.len = 5000;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "an oversized abort frame is accepted");
  f.type = 3;
  f.len = 1;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "a goodbye with a body is accepted");
  f.type = 4;
  f.len = 0;
  RR_EXPECT(tcp::check_frame_head(f, 4096).empty(), "a query is refused");
  f.len = 16;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "a query with a body is accepted");
  f.type = 5;
  RR_EXPECT(tcp::check_frame_head(f, 4096).empty(), "a state frame is refused");
  f.len = 17;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "a state frame of the wrong size is accepted");
  tcp::StateBody st;
  st.blocked_on = 3;
  RR_EXPECT(tcp::check_state_body(st, 4).empty(), "a valid state is refused");
  st.blocked_on = 4;
  RR_EXPECT(!tcp::check_state_body(st, 4).empty(), "a state naming a rank outside the group is accepted");
  st.blocked_on = -2;
  RR_EXPECT(!tcp::check_state_body(st, 4).empty(), "a state naming rank -2 is accepted");
  f.type = 9;
  f.len = 0;
  RR_EXPECT(!tcp::check_frame_head(f, 4096).empty(), "an unknown frame type is accepted");
  MsgHeader m;
  m.bytes = 10;
  RR_EXPECT(tcp::check_data_header(m, 32 + 10).empty(), "a consistent data header is refused");
  RR_EXPECT(!tcp::check_data_header(m, 32 + 11).empty(), "an inconsistent data header is accepted");
}

RR_TEST_MAIN()

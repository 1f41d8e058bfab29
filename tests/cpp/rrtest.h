// A minimal header-only test framework for the C++ tests (gtest is not installed, and CI must not
// need apt for it).
//
//   RR_TEST(sums_match) {
//     RR_REQUIRE(buf != nullptr, "no buffer");        // fails and ends this test
//     RR_EXPECT(got == want, "i=", i, " got ", got);  // fails and goes on
//     RR_EXPECT_THROWS(f(), "substring of what()");
//   }
//   RR_TEST_MAIN()
//
// The binary runs every test, or those whose name contains argv[1], prints one line per test and
// then "N passed, M failed", and exits nonzero if any test failed (or none matched).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

namespace rrtest {

struct TestCase {
  const char* name;
  void (*fn)();
};

inline std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;  // function-local: safe from static initialisation order
  return tests;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// Thrown by RR_REQUIRE to leave the test; never escapes run_all.
struct RequireFailed {};

struct State {
  int failures = 0;  // in the current test
};
inline State& state() {
  static State s;
  return s;
}

template <class... Args>
std::string message(const Args&... args) {
  std::ostringstream s;
  if constexpr (sizeof...(Args) > 0) (s << ... << args);
  return s.str();
}

// A loop over 65536 cases that is wrong everywhere would print 65536 lines; show the first few.
constexpr int kMaxPrintedFailures = 20;

inline void fail(const char* file, int line, const char* what, const std::string& msg) {
  const int n = ++state().failures;
  if (n <= kMaxPrintedFailures) {
    std::fprintf(stderr, "  %s:%d: FAILED: %s%s%s\n", file, line, what, msg.empty() ? "" : ": ",
                 msg.c_str());
  } else if (n == kMaxPrintedFailures + 1) {
    std::fprintf(stderr, "  (further failures of this test not printed)\n");
  }
}

inline int run_all(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int passed = 0, failed = 0;
  for (const TestCase& t : registry()) {
    if (filter && !std::strstr(t.name, filter)) continue;
    state().failures = 0;
    const auto start = std::chrono::steady_clock::now();
    try {
      t.fn();
    } catch (const RequireFailed&) {
      // already recorded
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, "uncaught exception", e.what());
    } catch (...) {
      fail(__FILE__, __LINE__, "uncaught exception", "(not a std::exception)");
    }
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start).count();
    const bool ok = state().failures == 0;
    (ok ? passed : failed)++;
    std::printf("[%s] %s (%.1f ms)", ok ? " OK " : "FAIL", t.name, ms);
    if (!ok) std::printf(", %d failure%s", state().failures, state().failures == 1 ? "" : "s");
    std::printf("\n");
    std::fflush(stdout);
  }
  if (filter && passed + failed == 0) {
    std::printf("no test name contains \"%s\"\n", filter);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return (failed > 0 || passed + failed == 0) ? 1 : 0;
}

}  // namespace rrtest

#define RR_TEST_CAT2_(a, b) a##b
#define RR_TEST_CAT_(a, b) RR_TEST_CAT2_(a, b)

#define RR_TEST(name)                                                                  \
  static void RR_TEST_CAT_(rrtest_fn_, name)();                                        \
  static const ::rrtest::Registrar RR_TEST_CAT_(rrtest_reg_, name)(#name,              \
                                                                   &RR_TEST_CAT_(rrtest_fn_, name)); \
  static void RR_TEST_CAT_(rrtest_fn_, name)()

#define RR_EXPECT(cond, ...)                                                               \
  do {                                                                                     \
    if (!(cond)) ::rrtest::fail(__FILE__, __LINE__, #cond, ::rrtest::message(__VA_ARGS__)); \
  } while (0)

#define RR_REQUIRE(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ::rrtest::fail(__FILE__, __LINE__, #cond, ::rrtest::message(__VA_ARGS__));             \
      throw ::rrtest::RequireFailed{};                                                       \
    }                                                                                        \
  } while (0)

// Passes if `expr` throws a std::exception whose what() contains `substring`.
#define RR_EXPECT_THROWS(expr, substring)                                                    \
  do {                                                                                       \
    bool rrtest_threw_ = false;                                                              \
    try {                                                                                    \
      (void)(expr);                                                                          \
    } catch (const ::rrtest::RequireFailed&) {                                               \
      throw;                                                                                 \
    } catch (const std::exception& rrtest_e_) {                                              \
      rrtest_threw_ = true;                                                                  \
      if (!std::strstr(rrtest_e_.what(), (substring))) {                                     \
        ::rrtest::fail(__FILE__, __LINE__, #expr,                                            \
                       ::rrtest::message("threw \"", rrtest_e_.what(),                       \
                                         "\", which does not contain \"", (substring), "\"")); \
      }                                                                                      \
    } catch (...) {                                                                          \
      rrtest_threw_ = true;                                                                  \
      ::rrtest::fail(__FILE__, __LINE__, #expr, "threw something not a std::exception");    \
    }                                                                                        \
    if (!rrtest_threw_) ::rrtest::fail(__FILE__, __LINE__, #expr, "did not throw");          \
  } while (0)

namespace rrtest {
// Passes if fn throws an E whose what() contains every string in `names`.
template <class E>
void expect_throw_naming(const char* file, int line, const char* what, const std::function<void()>& fn,
                         std::initializer_list<const char*> names) {
  try {
    fn();
  } catch (const E& e) {
    for (const char* s : names) {
      if (!std::strstr(e.what(), s)) {
        fail(file, line, what, message("\"", e.what(), "\" does not contain \"", s, "\""));
      }
    }
    return;
  }
  fail(file, line, what, "nothing was thrown");
}

// The bits of a value as an unsigned integer of its size, and back (std::bit_cast is C++20).
template <class To, class From>
To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of one size");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}
}  // namespace rrtest

// Passes if `expr` throws an exception of type E whose what() names every one of the strings.
#define RR_EXPECT_THROW_NAMING(E, expr, ...) \
  ::rrtest::expect_throw_naming<E>(__FILE__, __LINE__, #expr, [&] { expr; }, {__VA_ARGS__})

#define RR_TEST_MAIN() \
  int main(int argc, char** argv) { return ::rrtest::run_all(argc, argv); }

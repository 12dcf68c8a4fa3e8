// The C++ unit tests' tiny harness, shared by every ops/tests/test_*.cc.
// TEST(Name) registers a test; CHECK / CHECK_EQ print file:line, the failing
// expression and (for CHECK_EQ) both values, and count failures; main()
// (harness.cc) runs every test, or one named on the command line, and
// exits non-zero if any check failed. Each test file is linked, with
// harness.cc, into a binary of its own together with only the core sources
// its unit needs (tests/test_core_units.py).
#pragma once

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/message.h"

namespace test_harness {

extern int g_checks;
extern int g_failures;
extern const char* g_current_test;

void Fail(const char* file, int line, const std::string& what);

struct TestCase {
  const char* name;
  void (*fn)();
};

std::vector<TestCase>& Registry();

struct Registrar {
  Registrar(const char* name, void (*fn)()) { Registry().push_back({name, fn}); }
};

// ---- Printing values for failure messages --------------------------------

template <typename T>
std::string Show(const T& v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

inline std::string Show(const std::string& s) { return "\"" + s + "\""; }
inline std::string Show(const char* s) { return Show(std::string(s)); }
inline std::string Show(bool b) { return b ? "true" : "false"; }
// Small integers print as numbers, not characters.
inline std::string Show(int8_t v) { return std::to_string(v); }
inline std::string Show(uint8_t v) { return std::to_string(v); }
inline std::string Show(uint16_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%04x", static_cast<unsigned>(v));
  return buf;
}
inline std::string Show(hvdkeras::Response::Kind k) {
  return k == hvdkeras::Response::Kind::kOk ? "kOk" : "kError";
}

template <typename T>
std::string Show(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += Show(v[i]);
  }
  return s + "]";
}

// Deterministic pseudo-random numbers (no <random> distributions, whose
// output differs between standard libraries).
struct Lcg {
  uint64_t state;
  explicit Lcg(uint64_t seed) : state(seed) {}
  uint32_t Next() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  }
  int Below(int n) { return static_cast<int>(Next() % static_cast<uint32_t>(n)); }
};

}  // namespace test_harness

#define CHECK(cond)                                                    \
  do {                                                                 \
    ++test_harness::g_checks;                                          \
    if (!(cond)) test_harness::Fail(__FILE__, __LINE__, #cond);        \
  } while (0)

#define CHECK_EQ(a, b)                                                                 \
  do {                                                                                 \
    ++test_harness::g_checks;                                                          \
    const auto check_a_ = (a);                                                         \
    const auto check_b_ = (b);                                                         \
    if (!(check_a_ == check_b_)) {                                                     \
      using test_harness::Show;                                                        \
      test_harness::Fail(__FILE__, __LINE__,                                           \
                         std::string(#a " == " #b "\n    left:  ") + Show(check_a_) +  \
                             "\n    right: " + Show(check_b_));                        \
    }                                                                                  \
  } while (0)

#define TEST(name)                                                          \
  void name();                                                              \
  const test_harness::Registrar name##_registrar(#name, &name);             \
  void name()

// main() of every C++ unit test binary (see harness.h).
#include "tests/harness.h"

#include <cstring>

namespace test_harness {

int g_checks = 0;
int g_failures = 0;
const char* g_current_test = "";

void Fail(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", file, line, g_current_test,
               what.c_str());
}

std::vector<TestCase>& Registry() {
  static std::vector<TestCase> tests;
  return tests;
}

}  // namespace test_harness

int main(int argc, char** argv) {
  using namespace test_harness;
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional: run one test by name
  int ran = 0;
  for (const TestCase& t : Registry()) {
    if (only && std::strcmp(only, t.name) != 0) continue;
    g_current_test = t.name;
    const int before = g_failures;
    t.fn();
    ++ran;
    std::printf("[%s] %s\n", g_failures == before ? " OK " : "FAIL", t.name);
  }
  std::printf("%d tests, %d checks, %d failures\n", ran, g_checks, g_failures);
  if (ran == 0) {
    std::fprintf(stderr, "no test matched\n");
    return 2;
  }
  return g_failures == 0 ? 0 : 1;
}

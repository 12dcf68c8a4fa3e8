// Unit tests of the engine's settings text (core/engine_settings.cc): the
// defaults, parsing "name=value" lines, and refusing what it does not know
// without changing anything (see Note [engine settings]).
#include <cstdint>
#include <string>

#include "core/engine_settings.h"
#include "tests/harness.h"

namespace {

using hvdkeras::DescribeEngineSettings;
using hvdkeras::EngineConfig;
using hvdkeras::ParseEngineSettings;
using hvdkeras::Status;

TEST(DefaultsDescribeEverySettingInTableOrder) {
  const std::string text = DescribeEngineSettings(EngineConfig());
  CHECK_EQ(text,
           std::string("fusion_threshold=67108864\ncycle_time_ms=1\ncache_capacity=16384\n"
                       "stall_check_seconds=60\nstall_shutdown_seconds=1800\nliveness_seconds=60\n"
                       "timeline_path=\n"
                       "timeline_mark_cycles=0\nautotune=0\nautotune_log=\n"
                       "allreduce_chunk_bytes=1048576\nshm_allreduce=1\nhierarchical_allreduce=auto\n"
                       "ring_collectives=auto\nring_min_bytes=1048576\n"
                       "shm_arena_bytes=67108864\n"
                       "fusion_threshold_fixed=0\ncycle_time_fixed=0\n"));
}

TEST(ParsedValuesReplaceOnlyTheNamedSettings) {
  EngineConfig config;
  const Status s = ParseEngineSettings(
      "cycle_time_ms=2.5\ntimeline_path=/tmp/a b=c.json\nautotune=1\nfusion_threshold=0\n",
      &config);
  CHECK(s.ok());
  CHECK_EQ(config.cycle_time_ms, 2.5);
  CHECK_EQ(config.timeline_path, std::string("/tmp/a b=c.json"));  // split at the first '='
  CHECK_EQ(config.autotune, true);
  CHECK_EQ(config.fusion_threshold, int64_t{0});
  CHECK_EQ(config.cache_capacity, int64_t{16384});  // not named: default kept
}

TEST(DescribeThenParseRoundTrips) {
  EngineConfig config;
  config.cycle_time_ms = 0.1;  // not exact in binary: the text keeps every digit
  config.stall_shutdown_seconds = 30;
  config.autotune_log = "/tmp/log.csv";
  config.shm_allreduce = false;
  EngineConfig parsed;
  CHECK(ParseEngineSettings(DescribeEngineSettings(config), &parsed).ok());
  CHECK_EQ(DescribeEngineSettings(parsed), DescribeEngineSettings(config));
  CHECK_EQ(parsed.cycle_time_ms, 0.1);
}

TEST(UnknownNamesAndBadValuesChangeNothing) {
  EngineConfig config;
  const std::string before = DescribeEngineSettings(config);
  Status s = ParseEngineSettings("cycle_time_ms=3\nfusion_treshold=1\n", &config);
  CHECK(!s.ok());
  CHECK_EQ(s.message, std::string("unknown engine setting 'fusion_treshold'"));
  s = ParseEngineSettings("cycle_time_ms=3\nautotune=yes\n", &config);
  CHECK_EQ(s.message, std::string("engine setting 'autotune' has a bad value 'yes'"));
  s = ParseEngineSettings("fusion_threshold=12x\n", &config);
  CHECK_EQ(s.message, std::string("engine setting 'fusion_threshold' has a bad value '12x'"));
  s = ParseEngineSettings("cache_capacity\n", &config);
  CHECK(!s.ok());
  s = ParseEngineSettings("stall_check_seconds=\n", &config);
  CHECK(!s.ok());
  CHECK_EQ(DescribeEngineSettings(config), before);
}

TEST(EmptyTextKeepsDefaults) {
  EngineConfig config;
  CHECK(ParseEngineSettings("", &config).ok());
  CHECK_EQ(DescribeEngineSettings(config), DescribeEngineSettings(EngineConfig()));
}

}  // namespace

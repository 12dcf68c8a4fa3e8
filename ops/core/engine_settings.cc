#include "core/engine_settings.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace hvdkeras {

namespace {

bool ParseValue(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = value;
  return true;
}

bool ParseValue(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0') return false;
  *out = value;
  return true;
}

bool ParseValue(const std::string& text, bool* out) {
  if (text != "0" && text != "1") return false;
  *out = text == "1";
  return true;
}

bool ParseValue(const std::string& text, std::string* out) {
  *out = text;
  return true;
}

std::string FormatValue(int64_t value) { return std::to_string(value); }
std::string FormatValue(bool value) { return value ? "1" : "0"; }
std::string FormatValue(const std::string& value) { return value; }
std::string FormatValue(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

}  // namespace

Status ParseEngineSettings(const std::string& text, EngineConfig* config) {
  EngineConfig parsed = *config;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const size_t equals = line.find('=');
    const std::string name = line.substr(0, equals);
    const std::string value = equals == std::string::npos ? "" : line.substr(equals + 1);
    bool known = false;
    bool ok = false;
#define HVDKERAS_SETTING(type, setting, default_value, meaning) \
  if (name == #setting) {                                       \
    known = true;                                               \
    ok = ParseValue(value, &parsed.setting);                    \
  }
#include "core/engine_settings.def"
    if (!known) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "unknown engine setting '" + name + "'");
    }
    if (!ok || equals == std::string::npos) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "engine setting '" + name + "' has a bad value '" + value + "'");
    }
  }
  *config = parsed;
  return Status::OK();
}

std::string DescribeEngineSettings(const EngineConfig& config) {
  std::string out;
#define HVDKERAS_SETTING(type, setting, default_value, meaning) \
  out += #setting "=" + FormatValue(config.setting) + "\n";
#include "core/engine_settings.def"
  return out;
}

}  // namespace hvdkeras

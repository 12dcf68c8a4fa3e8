// The engine's settings, listed in engine_settings.def (see Note [engine settings]
// there), and their text form "name=value" per line, which is how they cross
// the C API.
#pragma once

#include <cstdint>
#include <string>

#include "core/common.h"

namespace hvdkeras {

struct EngineConfig {
#define HVDKERAS_SETTING(type, name, default_value, meaning) type name = default_value;
#include "core/engine_settings.def"
};

// Applies "name=value" lines to *config (settings not named keep their
// value). An unknown name or a value that does not parse is an error naming
// it; *config is then unchanged.
Status ParseEngineSettings(const std::string& text, EngineConfig* config);

// Every setting of `config` as "name=value" lines, in the table's order.
std::string DescribeEngineSettings(const EngineConfig& config);

}  // namespace hvdkeras

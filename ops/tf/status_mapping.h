// The engine's statuses as TensorFlow's.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "core/common.h"

namespace hvdkeras {

inline absl::Status ToTfStatus(const Status& s) {
  switch (s.code) {
    case StatusCode::kOk: return absl::OkStatus();
    case StatusCode::kPreconditionError: return absl::FailedPreconditionError(s.message);
    case StatusCode::kInvalidArgument: return absl::InvalidArgumentError(s.message);
    case StatusCode::kAborted: return absl::AbortedError(s.message);
    default: return absl::UnknownError(s.message);
  }
}

}  // namespace hvdkeras

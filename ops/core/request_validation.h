// Whether the ranks' requests for one name agree, and the message naming the
// tensor and what each rank sent when they do not. Pure logic with no MPI:
// the coordinator calls it once per name it answers.
#pragma once

#include <string>
#include <vector>

#include "core/message.h"

namespace hvdkeras {

// Checks that the submitting ranks' requests for one name agree (and, for
// broadcast, that the root is valid and has not joined). Returns "" when they
// do, or a message naming the tensor and what each rank sent.
std::string ValidateRequests(const std::vector<Request>& submitted, int world_size,
                             const std::vector<bool>& joined);

}  // namespace hvdkeras

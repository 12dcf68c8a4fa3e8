// Which ops tend to be submitted together, so that the engine can wait for
// the rest of a burst before negotiating instead of negotiating it piece by
// piece.
//
// Note [burst gathering]
// ~~~~~~~~~~~~~~~~~~~~~~
// A framework submits the collectives of one step from its own threads, one
// kernel at a time: 100 separate allreduces arrive over some tens of
// microseconds. The engine wakes at the first one, and without help it would
// negotiate and run the first few, then the next few, and so on: several
// negotiation rounds and several small fused buffers where one of each would
// do. The engine therefore remembers which ops last ran together (one cycle's
// agreed set); when a cycle starts with some members of such a set pending,
// it waits for the others to be submitted locally, up to the cycle time,
// before negotiating. The wait is local and bounded, so it can neither
// deadlock nor change results: at worst one step pays the cycle time once,
// after which the memory holds what really happened. Ops that depend on each
// other's results can never have run together, so they never wait for each
// other. Engine::RunCycle relies on this class; Engine::GatherBurst waits.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace hvdkeras {

class BurstMemory {
 public:
  // Remembers that these ops (names) ran together in one cycle. A name's
  // previous burst is forgotten.
  void Remember(const std::vector<std::string>& names);

  // Starts a count of what is pending locally at the start of a cycle.
  void BeginCount();
  // Counts one pending op.
  void Count(const std::string& name);
  // True while some remembered burst has a counted member but not all of them.
  bool Incomplete() const { return missing_ > 0; }
  // How many remembered members have not been counted yet.
  size_t missing() const { return missing_; }

  size_t remembered() const { return burst_of_.size(); }

 private:
  struct Burst {
    size_t size = 0;
    size_t counted = 0;
    size_t count_epoch = 0;
  };
  // True when `names` are exactly the members of one remembered burst.
  bool SameAsRemembered(const std::vector<std::string>& names) const;

  std::unordered_map<std::string, std::shared_ptr<Burst>> burst_of_;
  size_t epoch_ = 0;
  size_t missing_ = 0;  // over the bursts of this count with 0 < counted: size - counted
};

}  // namespace hvdkeras

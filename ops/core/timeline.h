// Chrome trace ("catapult" JSON) of what the engine did, written by rank 0.
// Each tensor name is shown as a process; its negotiation and the phases of
// its execution are nested duration events. The file is a valid JSON array
// at every moment: events are appended in one positioned write that replaces
// the closing bracket, so a killed process leaves a loadable trace.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "core/common.h"

namespace hvdkeras {

class Timeline {
 public:
  ~Timeline() { Close(); }

  // Starts a new trace at `path` (truncating it). Returns "" or an error.
  std::string Open(const std::string& path, bool mark_cycles);
  void Close();
  bool active() const { return fd_ >= 0; }
  bool mark_cycles() const { return mark_cycles_; }

  using TimePoint = std::chrono::steady_clock::time_point;

  void NegotiateStart(const std::string& name, OpType op, TimePoint when);
  void RankReady(const std::string& name, int rank, TimePoint when);
  void NegotiateEnd(const std::string& name, TimePoint when);
  void OpStart(const std::string& name, OpType op, const std::string& args_json);
  void OpEnd(const std::string& name);
  void ActivityStart(const std::string& name, const char* activity);
  void ActivityEnd(const std::string& name);
  void CycleStart();
  // A GPU batch as the device ran it (Note [device time] in device.h): a
  // complete event on each of its ops' "GPU" rows, written when the engine
  // learns of it, a cycle or more later.
  void DeviceSpan(const std::string& name, OpType op, TimePoint start, TimePoint end);
  // The framework waited for the op's result from `start` to `end` (the
  // next step's forward pass reaching a pending reduction: Note [pending
  // reductions] in ops/tf/pending_reductions.cc): a complete event on row 3.
  void WaitSpan(const std::string& name, TimePoint start, TimePoint end);

  // Appends the buffered events to the file.
  void Flush();

 private:
  int ProcessFor(const std::string& name);
  void CompleteEvent(const std::string& name, int row, const std::string& label,
                     TimePoint start, TimePoint end);
  void Event(const std::string& name, char phase, const std::string& label, TimePoint when,
             const std::string& args_json = "");
  int64_t Micros(TimePoint when) const;

  int fd_ = -1;
  bool mark_cycles_ = false;
  int64_t end_offset_ = 0;  // file offset of the closing "]"
  TimePoint start_;
  std::string buffer_;
  std::unordered_map<std::string, int> processes_;
};

}  // namespace hvdkeras

#include "core/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hvdkeras {

namespace {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      snprintf(hex, sizeof(hex), "\\u%04x", c);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string Timeline::Open(const std::string& path, bool mark_cycles) {
  Close();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return "cannot open timeline file " + path + ": " + std::strerror(errno);
  const char header[] = "[\n]";
  if (::write(fd, header, 3) != 3) {
    ::close(fd);
    return "cannot write timeline file " + path;
  }
  fd_ = fd;
  end_offset_ = 2;
  mark_cycles_ = mark_cycles;
  start_ = std::chrono::steady_clock::now();
  processes_.clear();
  buffer_.clear();
  return "";
}

void Timeline::Close() {
  if (fd_ < 0) return;
  Flush();
  ::close(fd_);
  fd_ = -1;
}

int64_t Timeline::Micros(TimePoint when) const {
  // Clamped at 0: an op already waiting when the trace opened would otherwise
  // begin before it, and Perfetto drops events with negative timestamps.
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(when - start_).count());
}

int Timeline::ProcessFor(const std::string& name) {
  auto it = processes_.find(name);
  if (it != processes_.end()) return it->second;
  const int pid = static_cast<int>(processes_.size()) + 1;
  processes_[name] = pid;
  buffer_ += ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"args\":{\"name\":\"" + JsonEscape(name) + "\"}}";
  buffer_ += ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"args\":{\"sort_index\":" + std::to_string(pid) + "}}";
  return pid;
}

void Timeline::Event(const std::string& name, char phase, const std::string& label,
                     TimePoint when, const std::string& args_json) {
  if (fd_ < 0) return;
  const int pid = ProcessFor(name);
  buffer_ += ",\n{\"ph\":\"";
  buffer_ += phase;
  buffer_ += "\",\"pid\":" + std::to_string(pid) + ",\"tid\":1,\"ts\":" +
             std::to_string(Micros(when));
  if (!label.empty()) buffer_ += ",\"name\":\"" + JsonEscape(label) + "\"";
  if (phase == 'i') buffer_ += ",\"s\":\"p\"";
  if (!args_json.empty()) buffer_ += ",\"args\":" + args_json;
  buffer_ += "}";
}

void Timeline::NegotiateStart(const std::string& name, OpType op, TimePoint when) {
  std::string label = "NEGOTIATE_";
  for (const char* c = OpTypeName(op); *c; ++c) label += static_cast<char>(toupper(*c));
  Event(name, 'B', label, when);
}

void Timeline::RankReady(const std::string& name, int rank, TimePoint when) {
  Event(name, 'i', "rank " + std::to_string(rank) + " ready", when,
        "{\"rank\":" + std::to_string(rank) + "}");
}

void Timeline::NegotiateEnd(const std::string& name, TimePoint when) { Event(name, 'E', "", when); }

void Timeline::OpStart(const std::string& name, OpType op, const std::string& args_json) {
  std::string label;
  for (const char* c = OpTypeName(op); *c; ++c) label += static_cast<char>(toupper(*c));
  Event(name, 'B', label, std::chrono::steady_clock::now(), args_json);
}

void Timeline::OpEnd(const std::string& name) {
  Event(name, 'E', "", std::chrono::steady_clock::now());
}

void Timeline::ActivityStart(const std::string& name, const char* activity) {
  Event(name, 'B', activity, std::chrono::steady_clock::now());
}

void Timeline::ActivityEnd(const std::string& name) {
  Event(name, 'E', "", std::chrono::steady_clock::now());
}

void Timeline::DeviceSpan(const std::string& name, OpType op, TimePoint start, TimePoint end) {
  if (fd_ < 0) return;
  std::string label = "GPU_";
  for (const char* c = OpTypeName(op); *c; ++c) label += static_cast<char>(toupper(*c));
  // Row 2 of the op's process: the host's nested spans stay on row 1.
  CompleteEvent(name, 2, label, start, end);
}

void Timeline::WaitSpan(const std::string& name, TimePoint start, TimePoint end) {
  if (fd_ < 0) return;
  CompleteEvent(name, 3, "FRAMEWORK_WAIT", start, end);
}

void Timeline::CompleteEvent(const std::string& name, int row, const std::string& label,
                             TimePoint start, TimePoint end) {
  buffer_ += ",\n{\"ph\":\"X\",\"pid\":" + std::to_string(ProcessFor(name)) +
             ",\"tid\":" + std::to_string(row) + ",\"ts\":" + std::to_string(Micros(start)) +
             ",\"dur\":" + std::to_string(std::max<int64_t>(Micros(end) - Micros(start), 0)) +
             ",\"name\":\"" + label + "\"}";
}

void Timeline::CycleStart() {
  if (!mark_cycles_) return;
  Event("(engine cycles)", 'i', "CYCLE_START", std::chrono::steady_clock::now());
}

void Timeline::Flush() {
  if (fd_ < 0 || buffer_.empty()) return;
  // The first event follows "[\n" directly, so drop its leading comma.
  if (end_offset_ == 2 && buffer_.compare(0, 2, ",\n") == 0) buffer_.erase(0, 2);
  buffer_ += "\n]";
  // One write that overwrites the old "]": the file is valid before and after.
  ssize_t written = ::pwrite(fd_, buffer_.data(), buffer_.size(), end_offset_);
  if (written == static_cast<ssize_t>(buffer_.size())) {
    end_offset_ += static_cast<int64_t>(buffer_.size()) - 1;
  }
  buffer_.clear();
}

}  // namespace hvdkeras

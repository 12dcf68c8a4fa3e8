// C entry point for the control plane's stand-in (core/virtual_ranks.h),
// for examples/control_plane_benchmark.py --simulate. Needs no MPI and no
// running engine.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/virtual_ranks.h"

namespace {

std::string JsonText(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

}  // namespace

extern "C" {

// Runs a virtual job: params[12] = ranks, tensors, steps, allgathers,
// shuffled (0/1), stragglers, cache capacity, seed, ranks per host, arrival
// cycles, rank 0 on its own core (0/1), bytes rank 0 writes before each
// cycle (Note [a cold rank 0]); with_order != 0 adds
// rank 0's agreed names. Writes one JSON object into `out` (cut to
// `capacity`) and returns its full length, so a caller can tell it was cut.
int64_t hvdkeras_virtual_job(const int64_t* params, int with_order, char* out,
                             int64_t capacity) {
  hvdkeras::VirtualJob job;
  job.ranks = static_cast<int>(params[0]);
  job.tensors = static_cast<int>(params[1]);
  job.steps = static_cast<int>(params[2]);
  job.allgathers = static_cast<int>(params[3]);
  job.shuffled = params[4] != 0;
  job.stragglers = static_cast<int>(params[5]);
  job.cache_capacity = params[6];
  job.seed = static_cast<uint64_t>(params[7]);
  job.ranks_per_host = static_cast<int>(params[8]);
  job.arrival_cycles = static_cast<int>(params[9]);
  job.rank0_own_core = params[10] != 0;
  job.rank0_evict_bytes = params[11];
  const hvdkeras::VirtualJobReport report = hvdkeras::RunVirtualJob(job);
  std::ostringstream json;
  json.precision(9);
  json << "{\"error\": " << JsonText(report.error)
       << ", \"agreed\": " << (report.agreed ? "true" : "false")
       << ", \"exact\": " << (report.exact ? "true" : "false")
       << ", \"rank0_table_peak_bytes\": " << report.rank0_table_peak_bytes
       << ", \"rank0_liveness_sockets\": " << report.rank0_liveness_sockets
       << ", \"cycle_fields\": [\"step\", \"rank0_cpu_s\", \"cached\", \"negotiated\", "
          "\"allreduces\", \"allreduce_bytes\", \"gathers\", \"gather_bytes_at_root\", "
          "\"broadcasts\", \"broadcast_bytes\"], \"cycles\": [";
  for (size_t i = 0; i < report.cycles.size(); ++i) {
    const hvdkeras::VirtualCycle& c = report.cycles[i];
    const hvdkeras::ExchangeCounts& e = c.exchanges;
    json << (i ? ", " : "") << "[" << c.step << ", " << c.rank0_cpu_s << ", " << c.cached << ", "
         << c.negotiated << ", " << e.allreduces << ", " << e.allreduce_bytes << ", "
         << e.gathers << ", " << e.gather_bytes_at_root << ", " << e.broadcasts << ", "
         << e.broadcast_bytes << "]";
  }
  json << "]";
  if (with_order) {
    json << ", \"order\": [";
    for (size_t i = 0; i < report.order.size(); ++i) {
      json << (i ? ", " : "") << JsonText(report.order[i]);
    }
    json << "]";
  }
  json << "}";
  const std::string text = json.str();
  if (out && capacity > 0) {
    const size_t n = std::min<size_t>(text.size(), static_cast<size_t>(capacity - 1));
    text.copy(out, n);
    out[n] = '\0';
  }
  return static_cast<int64_t>(text.size());
}

}  // extern "C"

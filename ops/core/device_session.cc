#include "core/device_session.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

namespace hvdkeras {

namespace {

// Each rank's "<host>: <GPU identity>" travels in a record of this size.
constexpr int64_t kIdentityBytes = 256;
// A record that starts with this holds why that rank cannot start instead.
constexpr char kProblemMark = '\x01';
// How many failed ranks a set-up refusal names (besides this rank).
constexpr int kProblemsNamed = 4;

Status Refused(const std::string& why) {
  return Status::Error(StatusCode::kPreconditionError,
                       "hvdkeras cannot run GPU collectives: " + why);
}

std::string HostName() {
  char name[128] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

// The GPU of a batch's tensors (-1 when all are a joined rank's stand-ins);
// a batch on two GPUs is an error.
Status BatchOrdinal(const std::vector<PendingOp*>& batch, int* ordinal) {
  *ordinal = -1;
  for (PendingOp* op : batch) {
    for (const TensorRef& t : op->tensors) {
      if (t.neutral) continue;
      if (*ordinal < 0) *ordinal = t.device;
      if (t.device != *ordinal) {
        return Status::Error(StatusCode::kInvalidArgument,
                             "collective '" + op->request.name + "' mixes GPUs " +
                                 std::to_string(*ordinal) + " and " + std::to_string(t.device) +
                                 ": hvdkeras runs one GPU per process (hvdkeras.pin_gpu()).");
      }
    }
  }
  return Status::OK();
}

// Two ranks on one GPU (no pinning, say): names both. Identities are
// "<host>: <GPU>", empty for a rank that has no GPU to offer.
std::string SharedGpu(const std::vector<std::string>& identities) {
  for (size_t a = 0; a < identities.size(); ++a) {
    for (size_t b = a + 1; b < identities.size(); ++b) {
      if (!identities[a].empty() && identities[a] == identities[b]) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) + " both use " +
               identities[a] + "; call hvdkeras.pin_gpu() after hvdkeras.init() so that each "
               "process uses its own GPU";
      }
    }
  }
  return "";
}

}  // namespace

Status DeviceSession::Prepare(const MpiContext& mpi, const std::vector<PendingOp*>& batch) {
  // Note [a failed GPU batch ends every rank]: nothing more runs here.
  if (!failure_.ok()) return failure_;
  int ordinal = -1;
  Status s = BatchOrdinal(batch, &ordinal);
  // Note [GPU checks are agreed]: the first batch's checks join Start's
  // agreement; a later batch's fail through Fail.
  if (!comm_) return Start(mpi, ordinal, s);
  if (s.ok() && ordinal >= 0 && ordinal != ordinal_) {
    s = Status::Error(StatusCode::kInvalidArgument,
                      "rank " + std::to_string(mpi.rank()) + " used GPU " +
                          std::to_string(ordinal_) + " and now GPU " + std::to_string(ordinal) +
                          ": hvdkeras runs one GPU per process; call hvdkeras.pin_gpu() before "
                          "building the model.");
  }
  if (!s.ok()) Fail(s);
  return s;
}

Status DeviceSession::Start(const MpiContext& mpi, int ordinal, const Status& checked) {
  // A batch of stand-ins alone (a joined rank) names no GPU: use the one
  // this process was pinned to or has used, not another rank's GPU 0.
  const int use = ordinal >= 0 ? ordinal : DefaultDevice();
  const DeviceBackend* backend = GetDeviceBackend();
  std::string problem;
  if (!checked.ok()) {
    problem = checked.message;
  } else if (backend == nullptr) {
    problem = kNoGpuPart;
  } else if ((device_ = backend->device(&problem)) == nullptr) {
    problem = "no GPU is usable: " + problem;
  } else {
    // The work that can fail on one rank alone (the lane's stream, the
    // kernels) comes first, so that the agreement below covers it.
    Status ready = device_->Prepare({use, lane_});
    if (!ready.ok()) problem = ready.message;
  }
  // Every rank learns every rank's GPU, or why it has none, so all see the
  // same sharing and the same problems, and end with the same reasons
  // without another exchange.
  std::string mine =
      problem.empty() ? HostName() + ": " + device_->Identity(use) : kProblemMark + problem;
  mine.resize(kIdentityBytes, '\0');
  std::vector<char> all(static_cast<size_t>(kIdentityBytes * mpi.size()));
  std::vector<int64_t> sizes(mpi.size(), kIdentityBytes), displs(mpi.size());
  for (int r = 0; r < mpi.size(); ++r) displs[r] = r * kIdentityBytes;
  Status s = mpi.Allgatherv(mine.data(), kIdentityBytes, all.data(), sizes, displs);
  if (!s.ok()) return s;
  std::vector<std::string> identities;
  std::string problems;
  int failed = 0, named = 0;
  for (int r = 0; r < mpi.size(); ++r) {
    const char* record = all.data() + r * kIdentityBytes;
    std::string text(record, strnlen(record, kIdentityBytes));
    if (!text.empty() && text[0] == kProblemMark) {
      // This rank's own reason in full; another's as far as its record
      // held; the first few ranks' only, so the message stays short on a
      // job of thousands of ranks that all lack a GPU.
      if (failed++ < kProblemsNamed || r == mpi.rank()) {
        const std::string why = r == mpi.rank() ? problem : text.substr(1);
        problems += (problems.empty() ? "" : "; ") + ("on rank " + std::to_string(r) + ", " + why);
        ++named;
      }
      text.clear();
    }
    identities.push_back(std::move(text));
  }
  if (failed > 0) {
    device_ = nullptr;
    return Refused(problems + (failed > named ? "; and " + std::to_string(failed - named) +
                                                    " more rank(s)"
                                              : ""));
  }
  const std::string shared = SharedGpu(identities);
  if (!shared.empty()) {
    device_ = nullptr;
    return Refused(shared);
  }

  // Rank 0 makes the communicator's id and every rank receives it: an empty
  // id tells every rank that rank 0 could not.
  std::string id;
  std::string id_problem;
  if (mpi.rank() == 0) {
    s = backend->new_unique_id(&id);
    if (!s.ok()) {
      id.clear();
      id_problem = s.message;
    }
  }
  int64_t id_bytes = static_cast<int64_t>(id.size());
  s = mpi.Broadcast(&id_bytes, sizeof(id_bytes), 0);
  if (!s.ok()) return s;
  id.resize(static_cast<size_t>(id_bytes));
  if (id_bytes > 0) {
    s = mpi.Broadcast(id.data(), id_bytes, 0);
    if (!s.ok()) return s;
  }
  if (id_bytes == 0) {
    device_ = nullptr;
    return Refused(mpi.rank() == 0 ? "on rank 0, " + id_problem
                                   : "rank 0 could not make the communicator's id (see its error)");
  }
  ordinal_ = use;
  // And once more after: a rank whose communicator failed must not leave
  // the others with one that waits for it at their first collective.
  Status made =
      backend->make_communicator(id, mpi.rank(), mpi.size(), lane(), wait_seconds_, &comm_);
  int32_t all_made = made.ok() ? 1 : 0;
  s = mpi.Allreduce(nullptr, &all_made, 1, DataType::kInt32, ReduceOp::kMin);
  if (!s.ok() || all_made == 0) {
    if (comm_) comm_->Abort();
    comm_.reset();
    device_ = nullptr;
    ordinal_ = -1;
    if (!s.ok()) return s;
    return made.ok() ? Refused("another rank could not make its communicator (see its error)")
                     : Refused("on rank " + std::to_string(mpi.rank()) + ", " + made.message);
  }
  const std::vector<int> others = AddCommunicatorLane(ordinal_, lane_);
  static std::atomic<bool> warned{false};
  if (!others.empty() && mpi.rank() == 0 && !warned.exchange(true)) {
    // Note [process sets sharing a GPU] in device.h.
    std::fprintf(stderr,
                 "hvdkeras: WARNING: process set %d now runs NCCL collectives on GPU %d beside "
                 "process set %d; NCCL does not order two communicators' kernels, so keep the "
                 "sets' GPU collectives from overlapping in time (docs/gpus.md, \"Process sets "
                 "on GPUs\")\n",
                 lane_, ordinal_, others[0]);
  }
  return Status::OK();
}

Status DeviceSession::Health() {
  if (!comm_) return Status::OK();
  Status s = comm_->AsyncError();
  if (!s.ok()) Close(/*collective=*/false);
  return s;
}

void DeviceSession::EndCommunicator(bool abort) {
  if (!comm_) return;
  if (abort) comm_->Abort();
  RemoveCommunicatorLane(ordinal_, lane_);
  comm_.reset();
}

void DeviceSession::Fail(const Status& why) {
  if (!failure_.ok()) return;  // the first reason is the one kept
  failure_reason_ = why.message;
  failure_ = Status::Error(StatusCode::kAborted,
                           "GPU collectives stopped on this rank after one failed: " +
                               why.message);
  // Note [a failed GPU batch ends every rank]: the communicator stays until
  // the agreed stop aborts it on every rank at once (Close). What this rank
  // queued before the failure finishes first, bounded by kDeviceWaitSeconds:
  // the batches whose completion every rank was told of are whole on every
  // rank, also here. A drain that fails or runs out changes nothing more.
  if (device_ != nullptr && comm_) device_->Synchronize(lane());
}

void DeviceSession::Close(bool collective) {
  EndCommunicator(/*abort=*/!collective);
  // The engine has stopped: its lane's stream and scratch memory go too
  // (a removed process set's would otherwise stay for the process's life).
  if (device_ != nullptr) device_->ReleaseLane(lane_);
  device_ = nullptr;
  ordinal_ = -1;
  failure_ = Status::OK();
  failure_reason_.clear();
}

}  // namespace hvdkeras

#include "core/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace hvdkeras {

namespace {

constexpr int kNameBytes = 64;
constexpr int64_t kPage = 4096;

// The machine's available memory (MemAvailable), or -1 where it cannot be
// read. A region is reserved page by page in memory, and /dev/shm may be
// sized beyond what the machine has (a tmpfs limit is only a limit).
int64_t AvailableMemoryBytes() {
  FILE* meminfo = std::fopen("/proc/meminfo", "r");
  if (!meminfo) return -1;
  char line[256];
  long long kib = -1;
  while (std::fgets(line, sizeof(line), meminfo)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  }
  std::fclose(meminfo);
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}

// Room for every rank of the host: half of what /dev/shm and the machine's
// memory both have free, the other half left for everything else (MPI's own
// shared memory, the processes themselves). With many ranks on one host
// (hundreds, oversubscribed) each region shrinks instead of the host running
// out of memory.
int64_t RoomPerRank(int local_ranks) {
  struct statvfs fs;
  if (statvfs("/dev/shm", &fs) != 0) return 0;
  int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  const int64_t memory = AvailableMemoryBytes();
  if (memory >= 0) free_bytes = std::min(free_bytes, memory);
  return free_bytes / 2 / std::max(1, local_ranks);
}

char* MapRegion(const char* name, int64_t bytes, bool create) {
  const int fd = create ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
  if (fd < 0) return nullptr;
  bool ok = !create || posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0;
  void* base = ok ? mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, 0)
                  : MAP_FAILED;
  close(fd);
  return base == MAP_FAILED ? nullptr : static_cast<char*>(base);
}

}  // namespace

ShmArena::State::~State() {
  for (size_t r = 0; r < regions.size(); ++r) {
    if (regions[r]) munmap(regions[r], static_cast<size_t>(sizes[r]));
  }
}

void ShmArena::Open(MPI_Comm comm, int64_t bytes) {
  Close();
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  bytes = std::min(bytes, RoomPerRank(size)) / kPage * kPage;
  static std::atomic<uint64_t> opened{0};
  char name[kNameBytes] = {0};
  std::snprintf(name, sizeof(name), "/hvdkeras-%d-%llu", static_cast<int>(getpid()),
                static_cast<unsigned long long>(opened++));
  auto state = std::make_shared<State>();
  state->rank = rank;
  state->regions.assign(size, nullptr);
  state->sizes.assign(size, 0);
  char* mine = bytes > 0 ? MapRegion(name, bytes, /*create=*/true) : nullptr;
  int ok = mine != nullptr;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (ok) {
    state->regions[rank] = mine;
    state->sizes[rank] = bytes;
    std::vector<char> names(static_cast<size_t>(kNameBytes) * size);
    std::vector<int64_t> sizes(size);
    MPI_Allgather(name, kNameBytes, MPI_CHAR, names.data(), kNameBytes, MPI_CHAR, comm);
    MPI_Allgather(&bytes, 1, MPI_INT64_T, sizes.data(), 1, MPI_INT64_T, comm);
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      state->sizes[r] = sizes[r];
      state->regions[r] = MapRegion(&names[static_cast<size_t>(r) * kNameBytes], sizes[r], false);
      if (!state->regions[r]) ok = 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  } else if (mine) {
    munmap(mine, static_cast<size_t>(bytes));
  }
  // Every rank has mapped what it could: the names can go, so nothing is
  // left behind in /dev/shm whatever happens to the job later.
  MPI_Barrier(comm);
  if (bytes > 0) shm_unlink(name);
  if (!ok) return;  // `state` unmaps whatever was mapped
  state->ranges = RangeAllocator(bytes);
  state_ = std::move(state);
}

std::shared_ptr<char> ShmArena::Acquire(int64_t bytes, int64_t* offset) {
  *offset = -1;
  if (!state_) return nullptr;
  std::shared_ptr<State> state = state_;
  int64_t at = -1;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    at = state->ranges.Allocate(bytes);
  }
  if (at < 0) return nullptr;
  *offset = at;
  return std::shared_ptr<char>(state->regions[state->rank] + at, [state, at, bytes](char*) {
    std::lock_guard<std::mutex> lock(state->mu);
    state->ranges.Free(at, bytes);
  });
}

}  // namespace hvdkeras

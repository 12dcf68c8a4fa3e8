// Which way a CPU allreduce goes, from the hosts the ranks run on. Pure: the
// engine gathers the layout over MPI (host_topology.h), this decides.
//
// Note [hierarchical allreduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With ranks on several hosts, a flat MPI allreduce sends every rank's whole
// buffer over the network. The hierarchical way (ShmAllreduce with a cross
// step) moves each host's data across hosts once: the elements of a piece are
// cut into `slices` slices, as many as the fewest ranks any host has. Within a
// host, local rank i (i < slices) reduces slice i over the host's ranks
// through shared memory (in local-rank order); local rank i of every host
// then allreduces that slice with its peers over MPI (the cross communicator
// of local rank i: one rank per host); the finished slice is shared back
// within the host. The result is the same on every rank of every host. It is
// exact wherever the flat path is exact (integer values, min, max), and for
// floating-point sums it differs from the flat one only in summation order,
// as MPI's own algorithms differ with the number of ranks. Ranks whose local
// rank is `slices` or more (hosts with more ranks than the smallest host)
// reduce no slice; they only contribute and read.
#pragma once

#include <string>
#include <vector>

namespace hvdkeras {

enum class AllreducePath {
  kMpi,           // MPI_Allreduce over all ranks
  kShm,           // one host: shared memory alone
  kHierarchical,  // shared memory within hosts, MPI across them
};

// The layout of the ranks over hosts, as every rank sees it.
struct HostLayout {
  int hosts = 1;
  int min_local_size = 1;
  int max_local_size = 1;
};

// From every rank's host index (0..hosts-1, in any order of ranks).
HostLayout LayoutOf(const std::vector<int>& host_of_rank);

// `hierarchical` is the engine setting: "auto", "on" or "off". Shared memory
// off means MPI everywhere (the hierarchical way reduces through it).
// Returns false and leaves *path alone for a setting it does not know.
bool ChooseAllreducePath(const HostLayout& layout, bool shm_enabled,
                         const std::string& hierarchical, AllreducePath* path);

// "mpi", "shm" or "hierarchical", as engine_config() reports it.
const char* AllreducePathName(AllreducePath path);

}  // namespace hvdkeras

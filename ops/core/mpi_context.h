// The MPI side of the engine: the communicator handed over from Python, the
// datatype and reduction mapping (with user-defined reductions for float16
// and bfloat16, which MPI lacks), and chunked collective calls.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "core/common.h"
#include "core/ring_collectives.h"

namespace hvdkeras {

class MpiContext {
 public:
  // Takes a communicator owned by the caller (Python duplicates it and frees
  // it after the engine stops). Creates the float16/bfloat16 reductions.
  Status Open(MPI_Comm comm);
  void Close();

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Large allreduces run as a sequence of in-place reductions of this many
  // bytes (0: one call), which keeps each step's data in cache.
  void set_allreduce_chunk_bytes(int64_t bytes) { allreduce_chunk_bytes_ = bytes; }

  // Large collectives of this context go around `ring` (whose communicator
  // duplicates this one) where RingWins(setting, hosts, ...) says so (Note
  // [ring across hosts] in ring_plan.h); null turns that off.
  void UseRing(const RingCollectives* ring, int hosts, RingSetting setting, int64_t min_bytes);
  // Whether a collective of `bytes` of `dtype` goes around the ring.
  bool RingTakes(int64_t bytes, DataType dtype) const;

  // Reduces `count` elements. sendbuf == nullptr means in place on recvbuf.
  // With `stages` (only where RingTakes: Note [fused work in the ring] in
  // ring_collectives.cc) the ring fills and finishes the buffer as it goes.
  Status Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dtype,
                   ReduceOp op, const RingStages* stages = nullptr) const;
  Status Broadcast(void* buffer, int64_t bytes, int root) const;
  // Byte-level variable-size collectives; counts and displacements in bytes.
  Status Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                    const std::vector<int64_t>& recv_bytes,
                    const std::vector<int64_t>& displs) const;
  Status Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_displs, void* recvbuf,
                   const std::vector<int64_t>& recv_bytes,
                   const std::vector<int64_t>& recv_displs) const;
  // Reduces `sendbuf` across ranks and leaves block r (recv_counts[r]
  // elements, blocks laid out in rank order) on rank r. `sendbuf` is
  // scratch: the ring adds into it.
  Status ReduceScatter(void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) const;
  Status Barrier() const;

 private:
  // MPI's own allreduce, in chunks.
  Status MpiAllreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dtype,
                      ReduceOp op) const;
  MPI_Datatype MpiType(DataType dtype) const;
  MPI_Op MpiOp(DataType dtype, ReduceOp op) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // [0] float16, [1] bfloat16; each: sum, min, max, product.
  MPI_Op half_ops_[2][4] = {};
  bool ops_created_ = false;
  int64_t allreduce_chunk_bytes_ = int64_t{1} << 20;
  const RingCollectives* ring_ = nullptr;
  int ring_hosts_ = 1;
  RingSetting ring_setting_ = RingSetting::kOff;
  int64_t ring_min_bytes_ = 0;
};

}  // namespace hvdkeras

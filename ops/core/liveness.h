// Liveness: telling a lost host from a slow one.
//
// Note [host liveness]
// ~~~~~~~~~~~~~~~~~~~~
// A cut link or a host that lost power leaves the other hosts' ranks inside
// MPI calls that never return, and the stall bound (Note [hang bound] in
// engine_settings.def) is long on purpose, because slow ranks are normal. So
// rank 0 and each other host exchange one byte each beat (a second, or a
// tenth of the bound when that is shorter) over TCP connections of their
// own (Note [liveness tree]), sent and read by the watchdog thread (C++, no
// GIL): a rank whose Python sleeps or computes for an hour still beats, so
// only a host that cannot be reached falls silent.
// - Rank 0 takes a host for lost when none of its watched ranks has been
//   heard for the bound (liveness_seconds, and at most half the stall bound,
//   so that liveness, not the stall, answers a cut link). It ends the job
//   naming that host and its ranks, which its failure record lists as the
//   silent ones (the launcher leaves the host out of an elastic restart).
// - A rank that hears nothing from rank 0 for the bound takes its own host
//   for the one cut off (rank 0 is the reference: with two sides that cannot
//   see each other, only one may call the other lost). It ends itself, and
//   its record says it was cut off, so the launcher does not blame rank 0's
//   host for it.
// - Neither side sends an MPI message to a silent rank: once the transport
//   (UCX) has given up on a peer behind a cut link, an MPI send to it
//   crashes the sender inside MPI (SIGSEGV in MPI_Isend, measured with
//   MPICH 5 and UCX on the network lab). The watchdog's questions skip
//   ranks this file reports silent for a few beats.
// These connections are not MPI's, so they need no MPI_THREAD_MULTIPLE. A
// connection that closes means the process ended (normally, or killed: the
// launcher sees that on its own) and stops being watched; the rank says
// goodbye first when it stops its engine. Ranks on rank 0's own host are not
// watched: a link cannot separate them, a process that dies is seen by the
// launcher, and one that is only stopped falls under the stall bound.
//
// Note [liveness tree]
// ~~~~~~~~~~~~~~~~~~~~
// What is watched is a host's link, so one connection per host carries it:
// the lowest rank of each host other than rank 0's (its leader) connects to
// rank 0, and the host's other ranks (its members) connect to their leader
// over loopback. Rank 0 holds one socket per other host, not one per rank
// (a 16,384-rank job on 2,048 hosts: 2,047, and rank 0 raises its
// descriptor limit to what that needs, or refuses to start naming the
// limit); a leader holds one per member. A leader passes each beat it reads
// from rank 0 on to its members at once, so a member's silence from rank 0
// is its leader's, a beat later: when the host is cut off, the leader and
// its members each end themselves within the bound, each with its own
// record. When the leader's connection to rank 0 ends (rank 0 said goodbye,
// or its process ended), the leader says goodbye to its members. A leader
// that ends on its own leaves its host's other ranks unwatched; the
// launcher sees a process that ends. PlanLivenessTree (liveness_rules.h) is
// the plan, liveness_start.cc the exchange that sets it up.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/common.h"
#include "core/liveness_rules.h"

namespace hvdkeras {

class Liveness {
 public:
  struct Verdict {
    // Rank 0: hosts whose leader has not been heard for the bound, and
    // every rank on them.
    std::vector<std::string> lost_hosts;
    std::vector<int> lost_ranks;
    // Another rank: rank 0 (through the leader, for a member) has not been
    // heard for the bound.
    bool cut_off = false;
    double silent_seconds = 0.0;
  };
  // A connected socket and the rank at its other end.
  struct Link {
    int fd = -1;
    int rank = -1;
  };

  ~Liveness() { Stop(); }

  // Takes over this rank's connections (Note [liveness tree]): `up` toward
  // rank 0 (fd -1 on rank 0), `down` the ranks that report here. `hosts`:
  // every rank's host on rank 0; on the others, rank 0's alone.
  // `leader_of`: on rank 0, every rank's leader (for SilentFor).
  void Adopt(int rank, Link up, const std::vector<Link>& down, std::vector<std::string> hosts,
             std::vector<int> leader_of, double bound_seconds);
  // Sends the beats that are due, reads what arrived, relays and judges.
  // Watchdog thread only.
  Verdict Poll();
  // Seconds since `rank`'s host was last heard from (0 when it is not
  // watched from here, or has been heard within a beat and a half). Any
  // thread.
  double SilentFor(int rank) const;
  std::string HostOf(int rank) const;
  double BeatSeconds() const;
  double bound_seconds() const;
  // Sockets held for liveness (open connections).
  int sockets() const;
  // Says goodbye to every peer and closes the connections (local).
  void Stop();

 private:
  struct Peer {
    int fd = -1;  // -1 once closed; a closed peer may still be watched (silent)
    int rank = -1;
    double last_heard = 0.0;
    bool watched = true;  // false once its process said goodbye or ended
  };
  // mu_ held.
  void Beat(double now);
  // Returns whether anything came from the peer toward rank 0.
  bool Read(Peer* peer, double now);
  void Close(Peer* peer, bool gone);
  void SayGoodbye();

  mutable std::mutex mu_;

  double bound_seconds_ = 0.0;
  double interval_seconds_ = 1.0;
  double last_beat_ = 0.0;
  int rank_ = 0;
  std::vector<std::string> hosts_;
  std::vector<int> leader_of_;  // rank 0 only
  Peer up_;                     // fd -1 and unwatched on rank 0
  std::vector<Peer> down_;
  std::map<int, size_t> down_index_;  // rank -> position in down_
};

}  // namespace hvdkeras

// The process's place in the job: MPI's lifetime, rank and world size, and the local rank
// that picks this process's GPU. Works the same under mpirun, srun and alone (world size 1).
//
// Local rank: OMPI_COMM_WORLD_LOCAL_RANK, else SLURM_LOCALID, else 0. Every rank knows the
// host of every rank (MPI_Get_processor_name, gathered once at start-up), so that a failure
// names the host of a rank that stopped answering: a lost host is what an operator replaces;
// and the CPUs every rank may run on, so that ranks sharing CPUs can divide them.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mantissa::dist {

class World {
 public:
  // MPI_Init_thread (MPI_THREAD_MULTIPLE where MPI provides it, at least FUNNELED) with
  // MPI_ERRORS_RETURN, so every failure reaches our checks and carries its context instead of
  // aborting inside MPI.
  World(int* argc, char*** argv);
  ~World();  // MPI_Finalize, bounded as MPI_Init is (dist/mpi_watchdog.h)
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  // The host rank `rank` runs on, as MPI_Get_processor_name reported it there; every rank's,
  // by rank.
  const std::string& host_of(int rank) const { return hosts_.at(static_cast<size_t>(rank)); }
  const std::vector<std::string>& hosts() const { return hosts_; }
  // The CPUs rank `rank` may run on, in increasing order (core::process_cpus at start-up: all
  // of its host's unless mpirun, srun or OpenMP's places bound it); empty where unknown.
  const std::vector<int>& cpus_of(int rank) const { return cpus_.at(static_cast<size_t>(rank)); }

  // Every rank's `mine`, by rank, on every rank: a collective of MPI_COMM_WORLD for the
  // start-up (up to 2 GiB from all ranks together), before the training steps: every rank must
  // call it at the same point, with no collective of the job's communicators in flight.
  // A rank that does not join within timeout_s ends the job as abort_on_timeout does.
  std::vector<std::string> all_gather(const std::string& mine, double timeout_s) const;

  // Prints "mantissa: rank R: <message>" to stderr and ends the whole job with `exit_code`
  // (MPI_Abort), so no rank is left waiting for a peer that gave up.
  [[noreturn]] void abort(int exit_code, const std::string& message) const;

  // --- failure detection (used by the communicators) -----------------------------------
  // The ranks that do not answer a probe within grace_s. Called by a rank whose wait on a
  // collective timed out: it pings every other rank on a communicator kept for this alone,
  // answers their pings, and counts a rank as answering when its answer comes. The live ranks
  // are stuck in the same collective, time out at about the same moment and probe too; a
  // dead or hung rank never answers, nor does one that ended since it pinged.
  std::vector<int> unresponsive_ranks(double grace_s) const;
  // What a timed-out wait does: names `what`, how long it waited, what the job was doing
  // (an Activity), the unresponsive ranks and their hosts, then aborts the job with the exit
  // code of core::ErrorKind::kPeerLost.
  [[noreturn]] void abort_on_timeout(const std::string& what, double waited_s) const;

  // What the job does besides training steps ("saving the checkpoint of step 9"), named by a
  // timed-out wait's message while the Activity lives: the same collective times out in a
  // step, a save or an evaluation, and an operator needs to know which.
  class Activity {
   public:
    Activity(const World& world, std::string what);
    ~Activity();
    Activity(const Activity&) = delete;
    Activity& operator=(const Activity&) = delete;

   private:
    const World& world_;
  };

 private:
  struct Probe;  // the probe communicator (an MPI handle kept out of this header)
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  std::vector<std::string> hosts_;      // by rank
  std::vector<std::vector<int>> cpus_;  // by rank
  std::unique_ptr<Probe> probe_;
  mutable std::mutex activity_mutex_;  // a wait may time out on another thread
  mutable std::string activity_;       // the living Activity's, else empty
  // MANTISSA_MPI_START_TIMEOUT_S: the bound on MPI_Init and MPI_Finalize.
  double mpi_timeout_s_ = 0;
};

// For `mantissa --version`: the MPI library this process loaded, as MPI_Get_library_version
// names it up to its first comma ("Open MPI v4.1.4"). Callable before MPI is initialised.
std::string mpi_library_version();

// "[2, 3]": how messages list ranks.
std::string format_ranks(const std::vector<int>& ranks);

// "node2, node3": the distinct hosts of `ranks` (hosts_by_rank[r] is rank r's), in the order
// `ranks` first names them.
std::string format_hosts(const std::vector<int>& ranks,
                         const std::vector<std::string>& hosts_by_rank);

}  // namespace mantissa::dist

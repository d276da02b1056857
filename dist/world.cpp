#include "dist/world.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "core/cpu_affinity.h"
#include "core/strings.h"
#include "dist/mpi/mpi_check.h"
#include "dist/mpi/mpi_comm_handle.h"
#include "dist/mpi_watchdog.h"
#include "dist/poll_wait.h"

namespace mantissa::dist {

std::string mpi_error_message(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  int rank = -1, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::ostringstream out;
  out << call << " failed on rank " << rank << ": " << std::string(text, length) << " (code "
      << code << ")";
  return out.str();
}

std::string mpi_library_version() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(version, &length) != MPI_SUCCESS) return "unknown";
  const std::string text(version, static_cast<size_t>(length));
  return text.substr(0, text.find_first_of(",\n"));
}

std::string format_ranks(const std::vector<int>& ranks) {
  std::string text = "[";
  text += core::join(ranks, ", ", [](int r) { return std::to_string(r); });
  return text + "]";
}

std::string format_hosts(const std::vector<int>& ranks,
                         const std::vector<std::string>& hosts_by_rank) {
  std::vector<std::string> hosts;
  for (int r : ranks) {
    const std::string& host = hosts_by_rank.at(static_cast<size_t>(r));
    if (std::find(hosts.begin(), hosts.end(), host) == hosts.end()) hosts.push_back(host);
  }
  return core::join(hosts, ", ");
}

// A duplicate of MPI_COMM_WORLD used only by unresponsive_ranks(), so probes never match a
// message of any other traffic.
struct World::Probe {
  CommHandle comm{MPI_COMM_WORLD};
};

namespace {

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

}  // namespace

World::World(int* argc, char*** argv) {
  // Open MPI's non-blocking all-reduce (libnbc) defaults to a binomial tree, which runs large
  // buckets 2-3x slower than the blocking MPI_Allreduce; the ring algorithm (reduce-scatter,
  // then all-gather, so every rank still gets the same bits) matches it. A value the user
  // set in the environment wins.
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
  // MPI_THREAD_MULTIPLE lets a thread of its own drive the progress of collectives while
  // this one computes (dist/mpi/mpi_progress.h); FUNNELED is all the rest needs.
  mpi_timeout_s_ = mpi_start_timeout_s();
  const MpiWatchdog watchdog(mpi_timeout_s_, MpiWait::kStart);  // until every rank's host is known
  int provided = 0;
  MANTISSA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  MANTISSA_REQUIRE(provided >= MPI_THREAD_FUNNELED, kFailure,
                   "MPI_Init_thread: the MPI library provides thread level "
                       << provided << ", mantissa needs MPI_THREAD_FUNNELED");
  MANTISSA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MANTISSA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MANTISSA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  local_rank_ = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", 0));
  // Every rank's host name in fixed-size slots, gathered while every rank still answers.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MANTISSA_MPI_CHECK(MPI_Get_processor_name(name, &length));
  std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  MANTISSA_MPI_CHECK(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                                   MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD));
  for (int r = 0; r < size_; ++r) {
    const char* slot = names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts_.emplace_back(slot, strnlen(slot, MPI_MAX_PROCESSOR_NAME));
  }
  // Every rank's CPUs: their counts, then the lists.
  const std::vector<int> mine = core::process_cpus();
  const int my_count = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(size_));
  MANTISSA_MPI_CHECK(
      MPI_Allgather(&my_count, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> offsets(static_cast<size_t>(size_) + 1, 0);
  for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + counts[r];
  std::vector<int> all(static_cast<size_t>(offsets.back()));
  MANTISSA_MPI_CHECK(MPI_Allgatherv(mine.data(), my_count, MPI_INT, all.data(), counts.data(),
                                    offsets.data(), MPI_INT, MPI_COMM_WORLD));
  for (int r = 0; r < size_; ++r)
    cpus_.emplace_back(all.begin() + offsets[r], all.begin() + offsets[r + 1]);
  probe_ = std::make_unique<Probe>();
}

namespace {

// Waits for a non-blocking collective of the start-up; past timeout_s, ends the job naming the
// ranks that do not answer, as the job's communicators do.
void wait_at_start(const World& world, MPI_Request& request, const char* what, double timeout_s) {
  poll_until(
      [&] {
        int done = 0;
        MANTISSA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      timeout_s, [&](double waited_s) { world.abort_on_timeout(what, waited_s); });
}

}  // namespace

std::vector<std::string> World::all_gather(const std::string& mine, double timeout_s) const {
  const int64_t my_length = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lengths(static_cast<size_t>(size_));
  MPI_Request request = MPI_REQUEST_NULL;
  MANTISSA_MPI_CHECK(MPI_Iallgather(&my_length, 1, MPI_INT64_T, lengths.data(), 1, MPI_INT64_T,
                                    MPI_COMM_WORLD, &request));
  wait_at_start(*this, request, "the start-up all-gather of the ranks' lengths", timeout_s);
  // Every rank sees the same lengths, so all of them refuse alike.
  std::vector<int> counts(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    offsets[r] = static_cast<int>(total);
    counts[r] = static_cast<int>(lengths[r]);
    total += lengths[r];
    MANTISSA_REQUIRE(total <= INT_MAX, kFailure,
                     "World::all_gather: the ranks' strings come to more than MPI can count");
  }
  std::string all(static_cast<size_t>(total), '\0');
  MANTISSA_MPI_CHECK(MPI_Iallgatherv(mine.data(), static_cast<int>(my_length), MPI_BYTE, all.data(),
                                     counts.data(), offsets.data(), MPI_BYTE, MPI_COMM_WORLD,
                                     &request));
  wait_at_start(*this, request, "the start-up all-gather of the ranks' strings", timeout_s);
  std::vector<std::string> by_rank;
  for (int r = 0; r < size_; ++r) by_rank.push_back(all.substr(offsets[r], counts[r]));
  return by_rank;
}

World::~World() {
  probe_.reset();
  const MpiWatchdog watchdog(mpi_timeout_s_, MpiWait::kEnd);
  MPI_Finalize();
}

void World::abort(int exit_code, const std::string& message) const {
  std::fprintf(stderr, "mantissa: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

std::vector<int> World::unresponsive_ranks(double grace_s) const {
  // Every rank that reaches this pings every other rank and answers each ping it receives with
  // a pong; a peer answered when its pong came. A ping alone proves nothing: one sent by a
  // rank that has since aborted still waits in this rank's queue when it comes here late (it
  // was stopped, then woken), and would name that rank as answering. This runs while the job
  // is failing, so an MPI call that fails here is not an error of its own: the peer it
  // concerns simply counts as not answering. Sends are not waited for (a dead peer may never
  // take them); the job ends right after.
  constexpr int kPingTag = 7001, kPongTag = 7002;
  const size_t n = static_cast<size_t>(size_);
  MPI_Comm comm = probe_->comm.get();
  const auto send_byte = [comm](int to, int tag) {
    static const char byte = 1;
    MPI_Request send = MPI_REQUEST_NULL;
    if (MPI_Isend(&byte, 1, MPI_CHAR, to, tag, comm, &send) == MPI_SUCCESS) {
      MPI_Request_free(&send);
    }
  };
  // Per peer: its ping to us (to answer) and its pong (its answer to ours).
  std::vector<char> ping_in(n, 0), pong_in(n, 0);
  std::vector<MPI_Request> pings(n, MPI_REQUEST_NULL), pongs(n, MPI_REQUEST_NULL);
  std::vector<bool> pinged_us(n, false), answered(n, false);
  pinged_us[static_cast<size_t>(rank_)] = answered[static_cast<size_t>(rank_)] = true;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const size_t i = static_cast<size_t>(r);
    // A receive that cannot be posted leaves no request (MPI leaves the handle undefined).
    if (MPI_Irecv(&ping_in[i], 1, MPI_CHAR, r, kPingTag, comm, &pings[i]) != MPI_SUCCESS) {
      pings[i] = MPI_REQUEST_NULL;
      pinged_us[i] = true;  // nothing to answer
    }
    if (MPI_Irecv(&pong_in[i], 1, MPI_CHAR, r, kPongTag, comm, &pongs[i]) == MPI_SUCCESS) {
      send_byte(r, kPingTag);
    } else {
      pongs[i] = MPI_REQUEST_NULL;
    }
  }
  // Until every peer has answered and every live peer's ping has been answered (a peer that
  // answered has pinged too), or the grace is over.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    bool done_all = true;
    for (size_t i = 0; i < n; ++i) {
      int done = 0;
      if (!pinged_us[i] && MPI_Test(&pings[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        pinged_us[i] = true;
        send_byte(static_cast<int>(i), kPongTag);
      }
      done = 0;
      if (!answered[i] && pongs[i] != MPI_REQUEST_NULL &&
          MPI_Test(&pongs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
        answered[i] = true;
      }
      done_all = done_all && answered[i] && pinged_us[i];
    }
    if (done_all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Receives still posted would write into ping_in and pong_in after they are gone: cancelled
  // (a local operation for a receive) and completed.
  for (std::vector<MPI_Request>* requests : {&pings, &pongs}) {
    for (MPI_Request& request : *requests) {
      if (request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    }
  }
  std::vector<int> silent;
  for (int r = 0; r < size_; ++r) {
    if (!answered[static_cast<size_t>(r)]) silent.push_back(r);
  }
  return silent;
}

void World::abort_on_timeout(const std::string& what, double waited_s) const {
  // The other live ranks stuck in the same collective time out within moments of us; give
  // them a fraction of the timeout (1 to 10 s) to answer the probe.
  const std::vector<int> silent = unresponsive_ranks(std::clamp(0.2 * waited_s, 1.0, 10.0));
  std::ostringstream message;
  message << what << " did not complete within " << waited_s << " s (dist.timeout_s)";
  {
    const std::lock_guard<std::mutex> lock(activity_mutex_);
    if (!activity_.empty()) message << " while " << activity_;
  }
  message << "; ";
  if (silent.empty()) {
    message << "every rank answered a probe, so a rank is stuck outside this collective "
               "(ranks out of step)";
  } else {
    message << "rank(s) " << format_ranks(silent) << " did not answer (host(s) "
            << format_hosts(silent, hosts_) << ")";
  }
  abort(core::exit_code(core::ErrorKind::kPeerLost), message.str());
}

World::Activity::Activity(const World& world, std::string what) : world_(world) {
  const std::lock_guard<std::mutex> lock(world_.activity_mutex_);
  world_.activity_ = std::move(what);
}

World::Activity::~Activity() {
  const std::lock_guard<std::mutex> lock(world_.activity_mutex_);
  world_.activity_.clear();
}

}  // namespace mantissa::dist

#include "rank_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "progress_monitor.h"

namespace ember::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLine = size_t(1) << 20;
constexpr std::string_view kEraseLine = "\033[K";
// Back to the start of the terminal line, and erase it.
constexpr std::string_view kClearLine = "\r\033[K";
// After the last rank exits, output still buffered in pipes held open by its own children is
// read for at most this long.
constexpr auto kDrainTime = std::chrono::seconds(1);
// How often a job on several machines asks whether a rank elsewhere failed.
constexpr auto kPeerPoll = std::chrono::milliseconds(200);
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Writes everything, waiting when the descriptor is non-blocking and full. A reader that went
// away (EPIPE) drops the output rather than stopping the job.
void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

void write_all(int fd, const std::string& text) { write_all(fd, text.data(), text.size()); }

void note(const std::string& message) { write_all(STDERR_FILENO, "ember launch: " + message + "\n"); }

// The line on the launcher's terminal that a rank is redrawing in place (a progress bar
// writing "\r" + its line), so that other output clears it first and draws it again after.
struct LiveLine {
  bool showing = false;
  int owner = -1;  // read end of the pipe redrawing it
  int target = -1;
  std::string text;  // prefixed, as shown
};

// What a terminal shows of `text`: the part after the last carriage return that has something
// after it ("a\rb" shows "b"; a CRLF line end keeps its line), without the erase-line sequence
// a redraw starts with.
std::string_view visible(std::string_view text) {
  while (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (const size_t cr = text.rfind('\r'); cr != std::string_view::npos) text.remove_prefix(cr + 1);
  if (text.starts_with(kEraseLine)) text.remove_prefix(kEraseLine.size());
  return text;
}

// One of a rank's output pipes, re-emitted line by line. Carriage returns are resolved to what a
// terminal would show: on a terminal the unfinished line is redrawn in place behind the prefix,
// elsewhere only a line's final state is written.
struct OutputPipe {
  int fd = -1;
  int target = STDOUT_FILENO;
  bool target_is_terminal = false;
  LiveLine* live = nullptr;
  std::string prefix;
  std::string pending;

  bool open() const { return fd >= 0; }

  void emit(std::string_view text) {
    const bool over_live_line = target_is_terminal && live->showing;
    std::string line;
    if (over_live_line) line.append(kClearLine);
    line.append(prefix).append(visible(text)).push_back('\n');
    write_all(target, line);
    if (!over_live_line) return;
    if (live->owner == fd)
      live->showing = false;  // its final state, now a line like any other
    else
      write_all(live->target, live->text);  // back in place under the line just written
  }

  // The unfinished line after its last carriage return is the rank's current redraw.
  void show_redraw() {
    const size_t cr = pending.rfind('\r');
    if (cr == std::string::npos || cr + 1 == pending.size()) return;
    pending.erase(0, cr + 1);
    if (!target_is_terminal) return;
    if (visible(pending).empty()) {
      // The rank erased its line (to print above it): so does the terminal.
      if (live->showing && live->owner == fd) {
        write_all(target, kClearLine.data(), kClearLine.size());
        *live = LiveLine{};
      }
      return;
    }
    live->text = prefix + std::string(visible(pending));
    live->showing = true;
    live->owner = fd;
    live->target = target;
    write_all(target, kClearLine.data(), kClearLine.size());
    write_all(target, live->text);
  }

  void emit_complete_lines() {
    size_t start = 0;
    for (;;) {
      const size_t nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      emit(std::string_view(pending).substr(start, nl - start));
      start = nl + 1;
    }
    pending.erase(0, start);
    show_redraw();
    while (pending.size() >= kMaxLine) {
      emit(std::string_view(pending).substr(0, kMaxLine));
      pending.erase(0, kMaxLine);
    }
  }

  void close_pipe() {
    if (!pending.empty()) emit(pending);
    pending.clear();
    if (live->owner == fd) *live = LiveLine{};
    ::close(fd);
    fd = -1;
  }

  // Reads what is available now; closes the pipe at end of file.
  void read_available() {
    char buffer[65536];
    while (open()) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n > 0) {
        pending.append(buffer, size_t(n));
        emit_complete_lines();
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        close_pipe();
      }
    }
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  OutputPipe out, err;
};

int status_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::vector<int> global_ranks(const std::vector<RankProcess>& ranks) {
  std::vector<int> out;
  for (const RankProcess& r : ranks) out.push_back(r.rank);
  return out;
}

class Supervisor {
 public:
  Supervisor(const SupervisorOptions& options, const std::vector<RankProcess>& ranks)
      : options_(options),
        specs_(ranks),
        monitor_(options.heartbeat_dir, options.monitor_interval, global_ranks(ranks), options.heartbeat_timeout) {}

  JobOutcome run() {
    outcome_.started_at = Clock::now();
    install_signal_handlers();
    for (const RankProcess& spec : specs_) {
      if (!start(spec)) {
        if (!ranks_.empty())
          note("stopping the " + std::to_string(ranks_.size()) + " rank" + (ranks_.size() == 1 ? "" : "s") +
               " already started");
        stop_all(SIGTERM);
        exit_status_ = exec_error_ == ENOENT ? 127 : 126;
        outcome_.start_failed = true;
        break;
      }
      // Ctrl-C, or a rank that failed already, while many ranks are still to start.
      handle_launcher_signals();
      reap();
      if (stopping_) break;
    }
    loop();
    restore_signal_handlers();
    if (monitor_.enabled()) monitor_.check(pids(), Clock::now());
    outcome_.status = exit_status_;
    outcome_.steps = monitor_.steps();
    outcome_.all_training_since = monitor_.all_training_since();
    return outcome_;
  }

 private:
  void install_signal_handlers() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      note(std::string("cannot create a pipe: ") + std::strerror(errno));
      std::exit(1);
    }
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    for (int sig : kForwardedSignals) {
      ::sigaction(sig, &action, &saved_actions_[sig]);
      // Started under nohup, or in the background by a non-interactive shell: stay deaf to it.
      if (saved_actions_[sig].sa_handler == SIG_IGN) ::sigaction(sig, &saved_actions_[sig], nullptr);
    }
    action.sa_flags = SA_NOCLDSTOP;
    ::sigaction(SIGCHLD, &action, &saved_actions_[SIGCHLD]);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &saved_actions_[SIGPIPE]);
    ::sigprocmask(SIG_SETMASK, nullptr, &saved_mask_);
  }

  void restore_signal_handlers() {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(sig, &saved_actions_[sig], nullptr);
  }

  // Pipes for one stream: the read end stays here (non-blocking), the write end goes to the rank.
  static bool make_pipe(int fds[2]) { return ::pipe2(fds, O_CLOEXEC) == 0 && ::fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0; }

  bool start(const RankProcess& spec) {
    int out[2], err[2], exec_status[2];
    if (!make_pipe(out) || !make_pipe(err) || ::pipe2(exec_status, O_CLOEXEC) != 0) {
      exec_error_ = errno;
      note(std::string("cannot create pipes for rank ") + std::to_string(spec.rank) + ": " + std::strerror(errno));
      return false;
    }
    // Everything the child needs is built before fork: it only calls async-signal-safe functions.
    std::vector<char*> argv, envp;
    for (const std::string& a : options_.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string& e : spec.environment) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();

    const pid_t pid = ::fork();
    if (pid < 0) {
      exec_error_ = errno;
      note(std::string("cannot start rank ") + std::to_string(spec.rank) + ": " + std::strerror(errno));
      for (int fd : {out[0], out[1], err[0], err[1], exec_status[0], exec_status[1]}) ::close(fd);
      return false;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      const int devnull = ::open("/dev/null", O_RDONLY);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(sig, &saved_actions_[sig], nullptr);
      ::sigprocmask(SIG_SETMASK, &saved_mask_, nullptr);
      ::execve(options_.program.c_str(), argv.data(), envp.data());
      const int error = errno;
      [[maybe_unused]] ssize_t n = ::write(exec_status[1], &error, sizeof(error));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before any signal is forwarded
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_status[1]);

    int error = 0;
    ssize_t n;
    do {
      n = ::read(exec_status[0], &error, sizeof(error));
    } while (n < 0 && errno == EINTR);
    ::close(exec_status[0]);
    if (n == ssize_t(sizeof(error))) {
      int ignored;
      while (::waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
      }
      ::close(out[0]);
      ::close(err[0]);
      exec_error_ = error;
      note("cannot execute '" + options_.program + "': " + std::strerror(error));
      return false;
    }

    index_of_pid_[pid] = ranks_.size();
    ++running_;
    Rank& r = ranks_.emplace_back();
    r.rank = spec.rank;
    r.pid = pid;
    r.running = true;
    const std::string prefix = "[rank " + std::to_string(spec.rank) + "] ";
    r.out = OutputPipe{out[0], STDOUT_FILENO, stdout_is_terminal_, &live_line_, prefix, {}};
    r.err = OutputPipe{err[0], STDERR_FILENO, stderr_is_terminal_, &live_line_, prefix, {}};
    return true;
  }

  void stop_all(int sig) {
    for (Rank& r : ranks_)
      if (r.running) ::kill(-r.pid, sig);
    if (sig == SIGKILL) {
      killed_ = true;
    } else if (!stopping_) {
      stopping_ = true;
      kill_deadline_ = Clock::now() + options_.grace;
    }
  }

  // Collects every rank that has exited. The launcher's only children are its ranks, so each
  // wake-up costs the ranks that exited, not all of them (thousands of ranks stop in seconds).
  void reap() {
    for (;;) {
      int status = 0;
      const pid_t got = ::waitpid(-1, &status, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return;
      const auto found = index_of_pid_.find(got);
      if (found == index_of_pid_.end()) continue;
      Rank& r = ranks_[found->second];
      index_of_pid_.erase(found);
      r.running = false;
      --running_;
      // Its last words come before anything said about it.
      r.out.read_available();
      r.err.read_available();
      if (stopping_ || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
      exit_status_ = status_code(status);
      outcome_.failure = JobOutcome::Failure{r.rank, WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                                             WIFSIGNALED(status) ? WTERMSIG(status) : 0};
      outcome_.failed_at = Clock::now();
      // Where it got to, before its file is read again by the next attempt's monitor.
      if (monitor_.enabled()) monitor_.check(pids(), outcome_.failed_at);
      const std::string how = WIFSIGNALED(status)
                                  ? "rank " + std::to_string(r.rank) + " was killed by " + signal_name(WTERMSIG(status))
                                  : "rank " + std::to_string(r.rank) + " exited with status " + std::to_string(exit_status_);
      if (WIFSIGNALED(status)) note(how);
      note("rank " + std::to_string(r.rank) + " exited with status " + std::to_string(exit_status_) +
           "; stopping the other ranks");
      tell_other_machines(how);
      stop_all(SIGTERM);
    }
  }

  void handle_launcher_signals() {
    unsigned char signals[64];
    ssize_t n;
    while ((n = ::read(g_signal_pipe[0], signals, sizeof(signals))) > 0)
      for (ssize_t i = 0; i < n; ++i) on_launcher_signal(signals[i]);
  }

  void on_launcher_signal(int sig) {
    if (sig == SIGCHLD) return;  // reaped after every wake-up
    if (stopping_) {
      if (!killed_) {
        note("received " + signal_name(sig) + " again; killing the ranks");
        stop_all(SIGKILL);
      }
      return;
    }
    note("received " + signal_name(sig) + "; stopping the ranks");
    exit_status_ = 128 + sig;
    outcome_.interrupted = true;
    stop_all(sig);
  }

  // A rank whose heartbeat went silent for the timeout: a failure like a crash, so the job stops.
  void lose_heartbeat(size_t index, Clock::time_point now) {
    const Rank& r = ranks_[index];
    exit_status_ = 1;
    outcome_.failure = JobOutcome::Failure{r.rank, 0, 0, true};
    outcome_.failed_at = now;
    const auto seconds = std::chrono::duration<double>(options_.heartbeat_timeout).count();
    char text[32];
    std::snprintf(text, sizeof(text), "%g", seconds);
    note("rank " + std::to_string(r.rank) + " made no progress for " + text + " s (--heartbeat_timeout" +
         (process_is_stopped(r.pid) ? "; it is stopped" : "") + "); stopping the ranks");
    tell_other_machines("rank " + std::to_string(r.rank) + " made no progress for " + text + " s");
    stop_all(SIGTERM);
    // A stopped rank acts on SIGTERM only once continued.
    for (const Rank& each : ranks_)
      if (each.running) ::kill(-each.pid, SIGCONT);
  }

  // A failure here, for the launchers of the job's other machines.
  void tell_other_machines(const std::string& how) {
    if (!options_.on_failure) return;
    try {
      options_.on_failure(how);
    } catch (const std::exception& e) {
      note(std::string("cannot tell the other machines: ") + e.what());
    }
  }

  // Stops the ranks here when a rank on another machine failed (or the launchers' store is
  // gone, so the job is over anyway).
  void check_other_machines(Clock::time_point now) {
    next_peer_check_ = now + kPeerPoll;
    std::optional<std::string> reason;
    try {
      reason = options_.peer_failure();
    } catch (const std::exception& e) {
      reason = std::string("the launchers' store is unreachable (") + e.what() + ")";
    }
    if (!reason) return;
    note(*reason + "; stopping the ranks on this machine");
    exit_status_ = 1;
    outcome_.stopped_for = *reason;
    outcome_.failed_at = now;
    stop_all(SIGTERM);
  }

  bool any_running() const { return running_ > 0; }

  // Each started rank's pid while it runs, -1 after; ranks not started yet are -1 too.
  std::vector<pid_t> pids() const {
    std::vector<pid_t> out(specs_.size(), -1);
    for (size_t i = 0; i < ranks_.size(); ++i)
      if (ranks_[i].running) out[i] = ranks_[i].pid;
    return out;
  }

  void loop() {
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      reap();
      const bool running = any_running();
      if (!running && !drain_deadline) drain_deadline = Clock::now() + kDrainTime;

      std::vector<pollfd> fds;
      std::vector<OutputPipe*> pipes;
      fds.push_back({g_signal_pipe[0], POLLIN, 0});
      for (Rank& r : ranks_)
        for (OutputPipe* p : {&r.out, &r.err})
          if (p->open()) {
            fds.push_back({p->fd, POLLIN, 0});
            pipes.push_back(p);
          }
      if (!running && pipes.empty()) break;

      const auto now = Clock::now();
      if (!running && now >= *drain_deadline) break;
      if (stopping_ && !killed_ && now >= kill_deadline_) {
        note("ranks still running after the grace period; sending SIGKILL");
        stop_all(SIGKILL);
        continue;
      }
      std::optional<Clock::time_point> wake;
      if (stopping_ && !killed_) wake = kill_deadline_;
      if (monitor_.enabled() && running && !stopping_) {
        if (now >= monitor_.next_check())
          if (const auto lost = monitor_.check(pids(), now)) lose_heartbeat(*lost, now);
        if (!wake || monitor_.next_check() < *wake) wake = monitor_.next_check();
      }
      if (options_.peer_failure && running && !stopping_) {
        if (now >= next_peer_check_) check_other_machines(now);
        if (!wake || next_peer_check_ < *wake) wake = next_peer_check_;
      }
      if (!running && (!wake || *drain_deadline < *wake)) wake = drain_deadline;
      int timeout = -1;
      if (wake)
        timeout = int(std::chrono::duration_cast<std::chrono::milliseconds>(*wake - now).count()) + 1;

      if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
        note(std::string("poll failed: ") + std::strerror(errno));
        stop_all(SIGKILL);
      }
      if (fds[0].revents & POLLIN) handle_launcher_signals();
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) pipes[i - 1]->read_available();
    }
    // Pipes still held open by processes the ranks left behind: keep what they said so far.
    for (Rank& r : ranks_)
      for (OutputPipe* p : {&r.out, &r.err})
        if (p->open()) p->close_pipe();
  }

  const SupervisorOptions& options_;
  const std::vector<RankProcess>& specs_;
  ProgressMonitor monitor_;
  JobOutcome outcome_;
  std::vector<Rank> ranks_;
  std::unordered_map<pid_t, size_t> index_of_pid_;  // of the running ranks
  size_t running_ = 0;
  struct sigaction saved_actions_[NSIG] {};
  sigset_t saved_mask_{};
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_deadline_{};
  Clock::time_point next_peer_check_{};
  int exit_status_ = 0;
  int exec_error_ = 0;
  const bool stdout_is_terminal_ = ::isatty(STDOUT_FILENO) != 0;
  const bool stderr_is_terminal_ = ::isatty(STDERR_FILENO) != 0;
  LiveLine live_line_;
};

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

JobOutcome supervise_ranks(const SupervisorOptions& options, const std::vector<RankProcess>& ranks) {
  return Supervisor(options, ranks).run();
}

}  // namespace ember::cli

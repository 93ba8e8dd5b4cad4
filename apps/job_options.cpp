// The options of `caf-hvd run` and `caf-hvd driver` (horovodrun's and torchrun's
// spellings too), checked one by one into a job_request before anything starts.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iostream>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "actors/driver_util.hpp"
#include "apps/job_options.hpp"
#include "runtime/observe/dashboard.hpp"
#include "runtime/network/nic.hpp"
#include "runtime/observe/text.hpp"
#include "runtime/job/env.hpp"
#include "runtime/job/horovod_knobs.hpp"
#include "runtime/network/net.hpp"

extern char** environ;

namespace cafhvd::cli {

namespace {

// Creates --output-filename's directory (with parents) and checks that it is writable,
// so that a typo fails before any rank starts.
void prepare_output_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw usage_error(fmt::format("--output-filename {}: cannot create it: {}", dir, ec.message()));
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    throw usage_error(
        fmt::format("--output-filename {}: not writable: {}", dir, std::strerror(errno)));
}

} // namespace

// horovodrun's tuning flags and the knob each sets (runtime/job/horovod_knobs.hpp): a
// switch sets its knob to `value`, the others take the flag's argument.
struct knob_flag {
  const char* flag;
  const char* arg;
  const char* value; // nullptr: the flag takes a value
  const char* help;
};
constexpr knob_flag knob_flags[] = {
    {"fusion-threshold-mb", "fusion_threshold_mb", nullptr, "HOROVOD_FUSION_THRESHOLD (MiB)"},
    {"cycle-time-ms", "cycle_time_ms", nullptr, "HOROVOD_CYCLE_TIME"},
    {"cache-capacity", "cache_capacity", nullptr, "HOROVOD_CACHE_CAPACITY"},
    {"hierarchical-allreduce", "hierarchical_allreduce", "true",
     "HOROVOD_HIERARCHICAL_ALLREDUCE=1"},
    {"no-hierarchical-allreduce", "hierarchical_allreduce", "false",
     "HOROVOD_HIERARCHICAL_ALLREDUCE=0"},
    {"hierarchical-allgather", "hierarchical_allgather", "true",
     "HOROVOD_HIERARCHICAL_ALLGATHER=1"},
    {"no-hierarchical-allgather", "hierarchical_allgather", "false",
     "HOROVOD_HIERARCHICAL_ALLGATHER=0"},
    {"torus-allreduce", "torus_allreduce", "true",
     "HOROVOD_TORUS_ALLREDUCE=1"},
    {"no-torus-allreduce", "torus_allreduce", "false", "HOROVOD_TORUS_ALLREDUCE=0"},
    {"autotune", "autotune", "true",
     "HOROVOD_AUTOTUNE=1, and the --autotune-* settings below"},
    {"no-autotune", "autotune", "false", "autotune off (the default)"},
    {"autotune-log-file", "autotune_log_file", nullptr, "HOROVOD_AUTOTUNE_LOG"},
    {"autotune-warmup-samples", "autotune_warmup_samples", nullptr,
     "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"},
    {"autotune-steps-per-sample", "autotune_steps_per_sample", nullptr,
     "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"},
    {"autotune-bayes-opt-max-samples", "autotune_bayes_opt_max_samples", nullptr,
     "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"},
    {"autotune-gaussian-process-noise", "autotune_gaussian_process_noise", nullptr,
     "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (0 to 1)"},
    {"timeline-filename", "timeline_filename", nullptr,
     "HOROVOD_TIMELINE (Horovod's own timeline; caf-hvd's is --events)"},
    {"timeline-mark-cycles", "timeline_mark_cycles", "true",
     "HOROVOD_TIMELINE_MARK_CYCLES=1 with --timeline-filename"},
    {"no-timeline-mark-cycles", "timeline_mark_cycles", "false",
     "HOROVOD_TIMELINE_MARK_CYCLES=0 with --timeline-filename"},
    {"no-stall-check", "no_stall_check", "true", "HOROVOD_STALL_CHECK_DISABLE=1"},
    {"stall-check", "no_stall_check", "false", "HOROVOD_STALL_CHECK_DISABLE=0"},
    {"stall-check-warning-time-seconds", "stall_check_warning_time_seconds", nullptr,
     "HOROVOD_STALL_CHECK_TIME_SECONDS"},
    {"stall-check-shutdown-time-seconds", "stall_check_shutdown_time_seconds", nullptr,
     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
    {"mpi-threads-disable", "mpi_threads_disable", "true",
     "HOROVOD_MPI_THREADS_DISABLE=1, with a warning: it applies to MPI, which caf-hvd does "
     "not use"},
    {"no-mpi-threads-disable", "mpi_threads_disable", "false",
     "HOROVOD_MPI_THREADS_DISABLE=0 (see --mpi-threads-disable)"},
    {"num-nccl-streams", "num_nccl_streams", nullptr, "HOROVOD_NUM_NCCL_STREAMS"},
    {"thread-affinity", "thread_affinity", nullptr, "HOROVOD_THREAD_AFFINITY"},
    {"tcp", "tcp_flag", "true", "NCCL_IB_DISABLE=1: TCP only"},
    {"gloo-timeout-seconds", "gloo_timeout_seconds", nullptr, "HOROVOD_GLOO_TIMEOUT_SECONDS"},
    {"log-level", "log_level", nullptr,
     "TRACE|DEBUG|INFO|WARNING|ERROR|FATAL: HOROVOD_LOG_LEVEL; TRACE and DEBUG also turn on "
     "--verbose"},
    {"log-with-timestamp", "log_with_timestamp", "true", "HOROVOD_LOG_HIDE_TIME=0"},
    {"log-without-timestamp", "log_with_timestamp", "false", "HOROVOD_LOG_HIDE_TIME=1"},
    {"log-hide-timestamp", "log_with_timestamp", "false",
     "= --log-without-timestamp (horovodrun's old name)"},
    {"no-log-hide-timestamp", "log_with_timestamp", "true",
     "= --log-with-timestamp (horovodrun's old name)"},
};

// horovodrun's -cb, for this installation: what a job can use here. Frameworks are the
// ranks' own (caf-hvd launches them), so it names the controller, the rendezvous and
// stores it serves, and whether the network module (TLS to node agents) loads.
void print_check_build(std::ostream& os) {
  std::string net_problem;
  try {
    net::module();
  } catch (const std::exception& e) {
    net_problem = e.what();
  }
  auto x = [](bool b) { return b ? "X" : " "; };
  os << fmt::format("caf-hvd v{} (CAF 0.17.6):\n\n"
                    "Available Controllers:\n"
                    "    [ ] MPI\n"
                    "    [X] Gloo\n\n"
                    "Served to every job:\n"
                    "    [X] Horovod's Gloo rendezvous (HTTP, elastic included)\n"
                    "    [X] torch.distributed's TCPStore at MASTER_PORT (--torch-store)\n\n"
                    "Node agents:\n"
                    "    [{}] network module (mutual TLS to node agents){}\n\n"
                    "Frameworks (TensorFlow, PyTorch, MXNet) and tensor operations (NCCL, "
                    "Gloo, ...) are those of the Horovod the ranks import: run its "
                    "`horovodrun -cb` where it is installed.\n",
                    caf_hvd_version, x(net_problem.empty()),
                    net_problem.empty() ? "" : ": " + net_problem);
}

// horovodrun's other spellings of our flags, before the command.
void canonical_args(std::vector<std::string>& args) {
  static const std::pair<const char*, const char*> renames[] = {
      {"--min-num-proc", "--min-np"},
      {"--max-num-proc", "--max-np"},
      {"-prefix-timestamp", "--prefix-output-with-timestamp"},
      {"--prefix-timestamp", "--prefix-output-with-timestamp"},
      {"-cb", "--check-build"},
      {"--cb", "--check-build"}};
  for (auto& a : args)
    for (auto& [from, to] : renames) {
      std::string f = from;
      if (a == f)
        a = to;
      else if (a.rfind(f + "=", 0) == 0)
        a = std::string{to} + a.substr(f.size());
    }
}

job_options::job_options(const std::string& title, bool with_hosts) : desc{title}, visible{title} {
  po::options_description job{"the job"}, hosts_opts{"hosts"}, elastic{"elastic jobs"},
      output{"output"}, net{"networking"}, torch{"torch.distributed"},
      compat{"horovodrun and torchrun spellings"}, gpu{"GPUs and CPUs"},
      exec{"executor mode (the caf_hvd Python "
           "package starts this)"},
      hidden;
  job.add_options()("help,h", "show this help")(
      "version,v", "print caf-hvd's version and exit (horovodrun's -v)")("np", po::value(&np),
                                                "number of ranks, written -np N as horovodrun and mpirun write it (--np N "
                                                "is the same flag; elastic: the initial minimum)")(
      "start-timeout", po::value(&start_timeout)->default_value(30),
      "seconds for every rank to be placed and started")(
      "kill-grace-seconds", po::value(&kill_grace)->default_value(5),
      "seconds between SIGTERM and SIGKILL when a job is stopped")(
      "env", po::value(&env)->composing(), "KEY=VALUE added to every rank (repeatable)")(
      "verbose", "print each step of the job with timings")("quiet",
                                                            "no summary at the end of the job");
  hosts_opts.add_options()("hosts,H", po::value(&hosts),
                           with_hosts ? "HOST:SLOTS or HOST:PORT:SLOTS, comma-separated"
                                      : "HOST:SLOTS naming this machine only (e.g. "
                                        "localhost:4; -np defaults to the slots)")(
      "hostfile", po::value(&hostfile),
      with_hosts ? "file of 'HOST[:PORT] slots=N' lines" : "a hostfile naming this machine only");
  if (with_hosts)
    hosts_opts.add_options()(
        "launcher", po::value(&launcher)->default_value("none"),
        "none|ssh|slurm: start a node agent on every host for this job and stop it at "
        "the end (ssh: one session per host; slurm: one srun step over the allocation); "
        "none: agents are already running")("ssh-port,p", po::value(&ssh_port),
                                            "--launcher ssh: the hosts' ssh port (horovodrun)")(
        "ssh-identity-file,i", po::value(&ssh_identity),
        "--launcher ssh: the private key to log in with (horovodrun)")(
        "ssh-option", po::value(&ssh_options)->composing(),
        "--launcher ssh: an ssh -o OPTION (repeatable)")(
        "agent-path", po::value(&agent_path),
        "--launcher ssh: caf-hvd on the hosts (default: this binary's path)")(
        "ssh-command", po::value(&ssh_command)->default_value("ssh"),
        "--launcher ssh: the ssh client to run")("srun-command",
                                                 po::value(&srun_command)->default_value("srun"),
                                                 "--launcher slurm: the srun to run");
  if (with_hosts)
    hosts_opts.add_options()(
        "cluster", po::value(&cluster_at),
        "HOST[:PORT]: with no -H/--hostfile (and outside an allocation), place the ranks on "
        "free slots of the cluster whose table that agent holds (default: $CAF_HVD_CLUSTER, "
        "else the installed agent's /etc/default/caf-hvd-node: the agent it joins, or "
        "itself); the slots are the job's until its ranks there are gone")(
        "placement", po::value(&placement)->default_value("pack"),
        "--cluster: pack (as few nodes as possible) or spread (across nodes)")(
        "node-label", po::value(&node_labels)->composing(),
        "--cluster: KEY=VALUE a node must have to get ranks (repeatable)")(
        "slot-wait", po::value(&slot_wait)->default_value(60),
        "--cluster: seconds to wait for free slots (jobs are served in the order they asked), "
        "then fail naming the shortfall");
  if (with_hosts)
    hosts_opts.add_options()("cluster-dir", po::value(&cluster),
                             "the cluster's credentials (see 'caf-hvd cluster init')")(
        "insecure", "talk to node agents without TLS (trusted networks only)")(
        "link-timeout", po::value(&link_timeout)->default_value(liveness::default_seconds),
        "seconds without a byte from a node agent before it counts as lost (hung or "
        "unreachable; an agent that dies is seen at once); agents started by --launcher "
        "get the same");
  output.add_options()(
      "output-filename", po::value(&output_dir),
      "also write each slot's output to DIR/HOST:LOCAL_RANK/{stdout,stderr}, with DIR/rank.N "
      "linking to the slot of rank N")("prefix-output-with-timestamp",
                                       "prefix every output line with the time it arrived")(
      "events", po::value(&events),
      "write the job's event log to FILE, one JSON object per line (default: "
      "$CAF_HVD_EVENTS)")("dashboard", po::value(&dashboard),
                          "[ADDR:]PORT: serve the job's live timeline page over HTTP "
                          "(loopback unless ADDR is given; PORT 0 picks one; the address is "
                          "printed at the start)")(
      "dashboard-name", po::value(&dashboard_names)->composing(),
      "NAME: a host name the dashboard answers to besides IP addresses and localhost "
      "(repeatable; requests naming any other host get 421, against DNS rebinding)")(
      "dashboard-keep", po::value(&dashboard_keep)->default_value(0),
      "seconds to keep serving the final page after the job ended (Ctrl-C ends it sooner)");
  net.add_options()("network-interface", po::value(&nics),
                    "NAME[,NAME...]: use only these interfaces between hosts");
  torch.add_options()(
      "torch-store", po::value(&torch_store)->default_value("auto"),
      "auto|on|off: serve torch's TCPStore at MASTER_PORT as torchrun does (auto: a client "
      "it cannot serve is reported; on: that also fails the job; off: MASTER_PORT is a free "
      "port for rank 0's own store)")("free-master-port", "the same as --torch-store off");
  if (with_hosts)
    elastic.add_options()("host-discovery-script", po::value(&discovery_script),
                          "executable printing the available hosts, one HOST, HOST:SLOTS or "
                          "HOST:PORT:SLOTS per line")("min-np", po::value(&min_np),
                                                      "fewest ranks to run with (default: -np)")(
        "max-np", po::value(&max_np), "most ranks to run with (default: all slots)")(
        "slots-per-host", po::value(&slots_per_host),
        "slots of a discovered host that prints no slot count")(
        "elastic-timeout", po::value(&elastic_timeout),
        "seconds to wait for --min-np slots, and how long a rank that holds the job's state "
        "may show no sign of life (CPU time, output) before it counts as failed while a new "
        "plan waits for it to re-join (default: $HOROVOD_ELASTIC_TIMEOUT or 600)")(
        "reset-limit", po::value(&reset_limit),
        "stop the job after this many resets (default: no limit)")(
        "cold-joins",
        "start a new host's ranks only once the running ranks re-joined, as horovodrun does "
        "(default: they start when the host is ready and wait at their first rendezvous "
        "while the others train on)")(
        "blacklist-cooldown-range", po::value(&cooldown)->multitoken(),
        "LOW HIGH seconds; a failed host returns after LOW*2^failures+jitter, clamped to "
        "[LOW, HIGH] (default: never)")("discovery-interval",
                                        po::value(&discovery_interval)->default_value(1),
                                        "seconds between runs of the discovery script "
                                        "(with --cluster: between questions to the table, "
                                        "which also tells the job of each change at once)");
  gpu.add_options()("gpus-per-slot", po::value(&gpus_per_slot),
                    "GPUs each rank gets; ranks go only where that many are free, and each "
                    "node lends them to this job alone until its ranks there are gone")(
      "use-gpu", "= --gpus-per-slot 1")(
      "cuda-visible-devices", po::value(&cuda_visible)->default_value("shared"),
      "shared|per-rank: CUDA_VISIBLE_DEVICES of a rank is every device of the job on its node "
      "(local rank i uses the i-th group) or only its own")(
      "cpus-per-slot", po::value(&cpus_per_slot),
      "CPUs each rank may use: sets OMP_NUM_THREADS unless you set it");
  if (!with_hosts)
    gpu.add_options()("gpus", po::value(&local_gpus),
                      "LIST|none: this machine's GPUs (default: detected when a job asks "
                      "for GPUs)");
  exec.add_options()("executor-fd", po::value(&executor_fd),
                     "FD is a connected socket to the executor's owner: ranks get frame "
                     "channels, calls come from FD (docs/executors.md: Executor frames)")(
      "executor-max-frame-mb", po::value(&max_frame_mb)->default_value(256),
      "largest frame payload in MiB, either direction");
  compat.add_options()("num-proc", po::value(&np), "= -np (horovodrun)")(
      "network-interfaces", po::value(&nics), "= --network-interface (horovodrun)")(
      "config-file", po::value(&config_file),
      "horovodrun's YAML file of tuning knobs (params, autotune, timeline, stall_check, "
      "library_options, logging, controller); flags given here win over it")(
      "check-build", "print what this installation supports (frameworks, controllers, "
                     "operations) and exit (horovodrun's -cb)");
  // horovodrun's knobs: each sets a HOROVOD_* variable of every rank, as horovodrun does
  for (auto& k : knob_flags) {
    if (k.value)
      compat.add_options()(k.flag, k.help);
    else
      compat.add_options()(k.flag, po::value<std::string>(), k.help);
  }
  compat.add_options()(
      "mpi-args", po::value<std::string>(),
      "accepted with a warning: there is no mpirun to pass them to (horovodrun)")(
      "binding-args", po::value<std::string>(),
      "accepted with a warning: ranks are not bound by an MPI launcher (horovodrun)")(
      "gloo", "accepted: Gloo is the controller")("disable-cache",
                                                  "accepted: caf-hvd caches nothing between jobs")(
      "mpi", "not supported: Gloo only")("jsrun", "not supported: Gloo only");
  // horovodrun's other spellings, rewritten to ours before parsing (canonical_args)
  hidden.add_options()("cb", "")("prefix-timestamp", "");
  if (with_hosts)
    hidden.add_options()("min-num-proc", po::value<int>(), "")("max-num-proc",
                                                               po::value<int>(), "");
  if (!with_hosts)
    compat.add_options()("ssh-port,p", po::value(&ssh_port),
                         "not for run (this machine only): caf-hvd driver --launcher ssh")(
        "ssh-identity-file,i", po::value(&ssh_identity),
        "not for run (this machine only): caf-hvd driver --launcher ssh");
  if (!with_hosts)
    compat.add_options()("nproc-per-node", po::value(&np),
                         "= -np (torchrun)")("nproc_per_node", po::value(&np), "= -np (torchrun)");
  hidden.add_options()("command", po::value(&command)->composing(), "the command to run");
  visible.add(job).add(hosts_opts);
  if (with_hosts)
    visible.add(elastic);
  visible.add(output).add(net).add(torch).add(gpu).add(exec).add(compat);
  desc.add(visible).add(hidden);
}

std::optional<job_request> parse_job_options(int argc, char** argv, bool embedded) {
  auto title = embedded ? std::string{"caf-hvd run: run a whole job on this machine.\n\n"
                                      "usage: caf-hvd run -np N [options] [--] COMMAND [ARGS...]\n"
                                      "The command starts at the first argument that is not an "
                                      "option; everything after it is the program's.\n"}
                        : std::string{"caf-hvd driver: run a job across node agents.\n\n"
                                      "usage: caf-hvd driver -np N (-H SPEC,... | --hostfile FILE) "
                                      "[options] [--] COMMAND [ARGS...]\n"
                                      "       caf-hvd driver --host-discovery-script PATH "
                                      "[--min-np N] [--max-np N] [options] [--] COMMAND\n"};
  job_options o{"options", !embedded};
  auto [args, cmd] = split_command(argc, argv, o.desc);
  if (std::find(args.begin(), args.end(), "--help") != args.end()
      || std::find(args.begin(), args.end(), "-h") != args.end()) {
    o.print_help(std::cout, title);
    return std::nullopt;
  }
  canonical_args(args);
  po::positional_options_description pos;
  pos.add("command", -1);
  auto vm = parse(args, o.desc, &pos);
  if (vm.count("version")) {
    std::cout << "caf-hvd " << caf_hvd_version << " (CAF 0.17.6)\n";
    return std::nullopt;
  }
  if (vm.count("check-build")) {
    print_check_build(std::cout);
    return std::nullopt;
  }
  o.command.insert(o.command.end(), cmd.begin(), cmd.end());

  job_config job;
  job.embedded = embedded;
  job.verbose = vm.count("verbose") > 0;
  job.quiet = vm.count("quiet") > 0;
  if (o.torch_store == "auto")
    job.torch_store = torch_store_mode::automatic;
  else if (o.torch_store == "on")
    job.torch_store = torch_store_mode::on;
  else if (o.torch_store == "off")
    job.torch_store = torch_store_mode::off;
  else
    throw usage_error(fmt::format("--torch-store '{}': expected auto, on or off", o.torch_store));
  if (vm.count("free-master-port")) {
    if (!vm["torch-store"].defaulted() && job.torch_store != torch_store_mode::off)
      throw usage_error("--free-master-port means --torch-store off; give only one of them");
    job.torch_store = torch_store_mode::off;
  }
  if (o.command.empty())
    throw usage_error("no command given, e.g. caf-hvd run -np 2 hostname");
  if (o.launcher != "none" && o.launcher != "ssh" && o.launcher != "slurm")
    throw usage_error(fmt::format("--launcher '{}': expected none, ssh or slurm", o.launcher));
  if (o.launcher == "slurm" && (!o.hosts.empty() || !o.hostfile.empty()))
    throw usage_error("--launcher slurm takes the hosts of the Slurm allocation it runs in; "
                      "leave out -H/--hostfile");
  if (o.launcher == "slurm" && vm.count("host-discovery-script"))
    throw usage_error("--launcher slurm starts agents for the allocation's hosts; an elastic "
                      "job's hosts need running agents");
  for (auto flag : {"ssh-port", "ssh-identity-file"})
    if (embedded && vm.count(flag))
      throw usage_error(fmt::format("--{} is not supported by caf-hvd run, which runs on this "
                                    "machine only; caf-hvd driver --launcher ssh starts node "
                                    "agents over ssh (or start `caf-hvd node` on each host)",
                                    flag));
  for (auto flag : {"ssh-port", "ssh-identity-file", "ssh-option", "agent-path"})
    if (vm.count(flag) && o.launcher != "ssh")
      throw usage_error(fmt::format("--{} belongs to --launcher ssh (caf-hvd starts no agents "
                                    "otherwise: start `caf-hvd node` on each host)",
                                    flag));
  if (o.launcher == "ssh" && vm.count("host-discovery-script"))
    throw usage_error("--launcher ssh starts agents for a fixed host list; an elastic job's "
                      "hosts need running agents");
  for (auto flag : {"mpi", "jsrun"})
    if (vm.count(flag))
      throw usage_error(fmt::format("--{} is not supported: caf-hvd runs Gloo jobs only", flag));
  // horovodrun's tunables are environment variables of the ranks: its flags first, then
  // its config file where they left a knob unset
  horovod_knobs knobs;
  const char* who = embedded ? "caf-hvd run" : "caf-hvd driver";
  for (auto& k : knob_flags) {
    if (!vm.count(k.flag))
      continue;
    for (auto& other : knob_flags)
      if (&other != &k && std::string{other.arg} == k.arg && vm.count(other.flag)
          && &other > &k)
        throw usage_error(fmt::format("--{} and --{} exclude each other", k.flag, other.flag));
    knobs.fill(k.arg, k.value ? k.value : vm[k.flag].as<std::string>());
  }
  if (vm.count("config-file")) {
    std::ifstream in{o.config_file};
    if (!in)
      throw usage_error(fmt::format("--config-file {}: cannot read it: {}", o.config_file,
                                    std::strerror(errno)));
    std::stringstream text;
    text << in.rdbuf();
    try {
      read_horovod_config(text.str(), o.config_file, knobs);
    } catch (const std::invalid_argument& e) {
      throw usage_error(e.what());
    }
  }
  try {
    for (auto& e : horovod_env(knobs))
      o.env.push_back(e);
  } catch (const std::invalid_argument& e) {
    throw usage_error(e.what());
  }
  if (knobs.has("log_level")) {
    auto level = knobs.values.at("log_level");
    std::transform(level.begin(), level.end(), level.begin(), ::toupper);
    if (level == "TRACE" || level == "DEBUG")
      job.verbose = true;
  }
  if (knobs.has("mpi_threads_disable"))
    std::cerr << fmt::format("{}: warning: --mpi-threads-disable sets "
                             "HOROVOD_MPI_THREADS_DISABLE, which only MPI jobs read; caf-hvd "
                             "runs Gloo jobs\n",
                             who);
  for (auto flag : {"mpi-args", "binding-args"})
    if (vm.count(flag))
      std::cerr << fmt::format("{}: warning: --{} is ignored: there is no mpirun here (ranks "
                               "are started by node agents)\n",
                               who, flag);
  job.prefix_timestamp = vm.count("prefix-output-with-timestamp") > 0;
  if (!vm.count("events"))
    if (const char* e = std::getenv("CAF_HVD_EVENTS"); e && *e)
      o.events = e;
  if (!o.events.empty()) {
    // Fails here, before anything starts, when the file cannot be written.
    int fd = ::open(o.events.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
      throw usage_error(
          fmt::format("--events {}: cannot write it: {}", o.events, std::strerror(errno)));
    ::close(fd);
    job.events_file = o.events;
  }
  if (!(o.dashboard_keep >= 0 && o.dashboard_keep <= 86400))
    throw usage_error("--dashboard-keep: give seconds from 0 to 86400");
  if (vm.count("dashboard-keep") && !vm["dashboard-keep"].defaulted() && o.dashboard.empty())
    throw usage_error("--dashboard-keep needs --dashboard");
  if (!o.dashboard_names.empty() && o.dashboard.empty())
    throw usage_error("--dashboard-name needs --dashboard");
  for (auto& n : o.dashboard_names)
    if (!valid_host_name(n))
      throw usage_error(fmt::format("--dashboard-name '{}': give a host name (letters, digits, "
                                    "'.', '-' or '_')",
                                    printable(n)));
  if (!o.dashboard.empty()) {
    try {
      parse_dashboard_address(o.dashboard);
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  }
  if (vm.count("executor-fd")) {
    struct stat st {};
    if (o.executor_fd < 0 || ::fstat(o.executor_fd, &st) != 0)
      throw usage_error(fmt::format("--executor-fd {}: not an open descriptor", o.executor_fd));
    if (!S_ISSOCK(st.st_mode))
      throw usage_error(fmt::format("--executor-fd {}: not a socket (the owner passes one end of a "
                                    "socketpair)",
                                    o.executor_fd));
    ::fcntl(o.executor_fd, F_SETFD, FD_CLOEXEC); // no child inherits the owner's channel
    job.executor_fd = o.executor_fd;
  }
  if (vm.count("use-gpu")) {
    if (vm.count("gpus-per-slot") && o.gpus_per_slot != 1)
      throw usage_error("--use-gpu means --gpus-per-slot 1; give only one of them");
    o.gpus_per_slot = 1;
  }
  if (o.gpus_per_slot < 0 || o.gpus_per_slot > 64)
    throw usage_error(fmt::format("--gpus-per-slot {}: expected 0 to 64", o.gpus_per_slot));
  if (o.cpus_per_slot < 0 || (vm.count("cpus-per-slot") && o.cpus_per_slot == 0))
    throw usage_error(fmt::format("--cpus-per-slot {}: expected at least 1", o.cpus_per_slot));
  if (o.cuda_visible != "shared" && o.cuda_visible != "per-rank")
    throw usage_error(
        fmt::format("--cuda-visible-devices '{}': expected shared or per-rank", o.cuda_visible));
  job.gpus_per_slot = static_cast<uint32_t>(o.gpus_per_slot);
  job.cpus_per_slot = static_cast<uint32_t>(o.cpus_per_slot);
  job.cuda_per_rank = o.cuda_visible == "per-rank";
  std::optional<gpu_inventory> local_inventory;
  if (embedded && vm.count("gpus")) {
    try {
      local_inventory = gpu_inventory{parse_gpu_list(o.local_gpus), "--gpus"};
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  } else if (embedded && job.gpus_per_slot > 0) {
    local_inventory = detect_gpus();
  }
  if (!(o.max_frame_mb > 0 && o.max_frame_mb <= 4095))
    throw usage_error("--executor-max-frame-mb must be between 0 and 4095");
  job.max_frame = static_cast<uint64_t>(o.max_frame_mb * 1024 * 1024);
  bool elastic = vm.count("host-discovery-script") > 0;
  // An elastic job may follow the cluster's table instead of a script: --cluster (or
  // $CAF_HVD_CLUSTER) with no host list and --min-np or --max-np.
  std::string elastic_cluster, elastic_cluster_source;
  if (!embedded && !elastic && o.hosts.empty() && o.hostfile.empty()
      && (vm.count("min-np") || vm.count("max-np"))) {
    auto where = default_cluster(o.cluster_at);
    elastic_cluster = where.address;
    elastic_cluster_source = where.source;
    elastic = !elastic_cluster.empty();
  }
  for (auto flag : {"min-np", "max-np", "slots-per-host", "elastic-timeout", "reset-limit",
                    "blacklist-cooldown-range", "cold-joins"})
    if (!elastic && vm.count(flag))
      throw usage_error(fmt::format("--{} belongs to elastic jobs: give --host-discovery-script "
                                    "too (or --cluster, whose live nodes are then the hosts)",
                                    flag));
  // Inside a batch allocation and without -H/--hostfile, the allocation gives the hosts.
  std::optional<allocation> alloc;
  if (!embedded && !elastic && o.hosts.empty() && o.hostfile.empty()) {
    try {
      alloc = detect_allocation();
    } catch (const spec_error& e) {
      throw usage_error(e.what());
    }
  }
  // Then $CAF_HVD_HOSTS/$CAF_HVD_HOSTFILE, then the cluster (--cluster, $CAF_HVD_CLUSTER).
  std::optional<cluster_address> cluster;
  std::string host_source;
  if (!embedded && !elastic && o.hosts.empty() && o.hostfile.empty() && !alloc) {
    const char* env_hosts = std::getenv("CAF_HVD_HOSTS");
    const char* env_file = std::getenv("CAF_HVD_HOSTFILE");
    if (env_hosts && *env_hosts) {
      o.hosts = env_hosts;
      host_source = "$CAF_HVD_HOSTS";
    } else if (env_file && *env_file) {
      o.hostfile = env_file;
      host_source = "$CAF_HVD_HOSTFILE";
    } else {
      auto choice = default_cluster(o.cluster_at);
      auto where = choice.address;
      host_source = choice.source;
      if (!where.empty()) {
        try {
          cluster = parse_cluster_address(where, default_node_port);
        } catch (const std::exception& e) {
          throw usage_error(fmt::format("{} '{}': {}", host_source, where, e.what()));
        }
      }
    }
  } else if (!embedded && !elastic) {
    host_source = alloc ? alloc->source : !o.hosts.empty() ? "-H" : "--hostfile";
  }
  if (vm.count("placement") && o.placement != "pack" && o.placement != "spread")
    throw usage_error(fmt::format("--placement '{}': give pack or spread", o.placement));
  if (!(o.slot_wait >= 0 && o.slot_wait <= 86400))
    throw usage_error(fmt::format("--slot-wait {}: give seconds from 0 to 86400", o.slot_wait));
  std::vector<std::string> node_labels;
  try {
    node_labels = parse_labels(o.node_labels);
  } catch (const std::exception& e) {
    std::string m = e.what(); // "--label 'X': ..." as the agent's option says it
    throw usage_error(m.rfind("--label", 0) == 0 ? "--node-" + m.substr(2) : m);
  }
  if (!cluster && !o.cluster_at.empty() && (!o.hosts.empty() || !o.hostfile.empty() || alloc))
    std::cerr << fmt::format("caf-hvd: the hosts come from {}; --cluster is not used\n",
                             host_source);
  if (o.launcher == "slurm" && (!alloc || alloc->source.rfind("Slurm", 0) != 0))
    throw usage_error("--launcher slurm runs inside a Slurm allocation (salloc, sbatch): "
                      "SLURM_JOB_ID is not set");
  if (!elastic && !np_given(vm) && !alloc
      && !(embedded && (!o.hosts.empty() || !o.hostfile.empty())))
    throw usage_error("-np is required: the number of ranks");
  if (np_given(vm) && o.np < 1)
    throw usage_error(fmt::format("-np {}: need at least 1 rank", o.np));
  if (!(o.start_timeout > 0))
    throw usage_error("--start-timeout must be a positive number of seconds");
  if (!(o.kill_grace >= 0))
    throw usage_error("--kill-grace-seconds must not be negative");
  try {
    liveness::from_seconds(o.link_timeout);
  } catch (const std::exception& e) {
    throw usage_error(e.what());
  }
  for (auto& kv : o.env) {
    try {
      parse_env_assignment(kv);
    } catch (const std::exception& e) {
      throw usage_error(e.what());
    }
  }
  if (embedded) {
    if (!o.hosts.empty() || !o.hostfile.empty())
      o.np = local_slots(o, np_given(vm) ? std::optional<int>{o.np} : std::nullopt);
    job.hosts = {host_spec{"localhost", 0, static_cast<uint32_t>(o.np)}};
  } else if (elastic) {
    job.elastic = elastic_options(o, vm, !elastic_cluster.empty());
    o.np = job.elastic->min_np;
    if (!elastic_cluster.empty()) {
      cluster_address a;
      try {
        a = parse_cluster_address(elastic_cluster, default_node_port);
      } catch (const std::exception& e) {
        throw usage_error(
            fmt::format("{} '{}': {}", elastic_cluster_source, elastic_cluster, e.what()));
      }
      std::string error;
      auto ip = resolve_ipv4(a.host, &error);
      if (!ip)
        throw usage_error(fmt::format("{} '{}': cannot resolve '{}': {}", elastic_cluster_source,
                                      elastic_cluster, a.host, error));
      a.host = *ip;
      job.elastic->cluster = a;
      job.elastic->cluster_labels = node_labels;
      job.job_id = make_job_id();
      host_source = fmt::format("the cluster at {}:{} (elastic: its live nodes; from {})", a.host,
                                a.port, elastic_cluster_source);
    }
  } else if (cluster) {
    if (o.launcher != "none")
      throw usage_error("--launcher starts agents on listed hosts; a cluster's agents run "
                        "already");
    job.job_id = make_job_id();
  } else {
    static_hosts(o, vm, alloc, job);
  }
  if (!embedded && (!elastic || job.elastic->cluster) && vm.count("verbose"))
    std::cerr << fmt::format("caf-hvd: the hosts come from {}\n",
                             cluster ? fmt::format("the cluster at {}:{} ({})", cluster->host,
                                                   cluster->port, host_source)
                                     : host_source);
  job.np = o.np;
  job.command = o.command;
  job.extra_env = o.env;
  job.base_env = forwardable_environment(environ);
  char cwd[4096];
  job.cwd = getcwd(cwd, sizeof(cwd)) ? cwd : "/";
  job.start_timeout = std::chrono::milliseconds(static_cast<long>(o.start_timeout * 1000));
  job.kill_grace = std::chrono::milliseconds(static_cast<long>(o.kill_grace * 1000));
  job.output_dir = o.output_dir;
  if (vm.count("network-interface")) {
    std::string_view rest = o.nics;
    while (true) {
      auto comma = rest.find(',');
      auto name = rest.substr(0, comma);
      if (name.empty() || name.size() > 15)
        throw usage_error(fmt::format("--network-interface '{}': expected NAME[,NAME...] with "
                                      "interface names of 1 to 15 characters",
                                      o.nics));
      job.network_interfaces.emplace_back(name);
      if (comma == std::string_view::npos)
        break;
      rest = rest.substr(comma + 1);
    }
  }
  if (!job.output_dir.empty())
    prepare_output_dir(job.output_dir);

  job_request r;
  r.job = std::move(job);
  r.elastic = elastic;
  r.local_gpus = std::move(local_inventory);
  r.tls = {vm.count("insecure") > 0, vm.count("cluster-dir") > 0, o.cluster};
  r.launcher.kind = o.launcher;
  r.launcher.ssh_command = o.ssh_command;
  r.launcher.ssh_port = o.ssh_port;
  r.launcher.ssh_identity = o.ssh_identity;
  r.launcher.ssh_extra = o.ssh_options;
  r.launcher.agent_path = o.agent_path;
  r.launcher.srun_command = o.srun_command;
  r.launcher.link_timeout = o.link_timeout;
  r.link_timeout = o.link_timeout;
  r.dashboard = o.dashboard;
  r.dashboard_keep = o.dashboard_keep;
  r.dashboard_names = o.dashboard_names;
  r.cluster = cluster;
  r.place.job = r.job.job_id;
  r.place.np = static_cast<uint32_t>(o.np);
  r.place.spread = o.placement == "spread";
  r.place.labels = node_labels;
  r.place.hold_ms = static_cast<uint32_t>(o.start_timeout * 1000) + 10000;
  r.place.cpus_per_slot = r.job.cpus_per_slot;
  r.place.gpus_per_slot = r.job.gpus_per_slot;
  r.slot_wait = o.slot_wait;
  return r;
}

} // namespace cafhvd::cli

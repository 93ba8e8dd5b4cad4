// Node agents for one job over ssh: `ssh HOST caf-hvd node --port 0 ...` on every host
// at once (bounded), each agent's port read from its first line, ssh's own error named
// for every host that fails. The agents end with their ssh sessions: when this object
// closes their stdin, or when the driver dies (caf-hvd-exec kills the ssh client).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cafhvd {

struct ssh_options {
  std::string client = "ssh";            // ssh or srun (tests put a stand-in here)
  int port = 0;                          // -p (0: ssh's default)
  std::string identity;                  // -i
  std::vector<std::string> extra;        // -o OPTION each
  std::string agent_path;                // caf-hvd on the hosts
  std::string cluster_dir;               // --cluster-dir for the agents ("" = insecure)
  std::string shim;                      // caf-hvd-exec (ties ssh to this process)
  std::chrono::milliseconds timeout{30000};
  double link_timeout = 0;               // the agents' --link-timeout (0: their default)
  size_t parallel = 64;                  // sessions opened at once
};

struct ssh_host {
  std::string host;  // as ssh reaches it
  std::string name;  // --name of its agent
  std::string bind;  // address the agent listens on
};

/// What became of one host: the agent's port, or why there is none.
struct ssh_result {
  uint16_t port = 0;
  std::string error;
};

/// Quotes `arg` for a POSIX shell (ssh runs the remote command through one).
std::string shell_quote(const std::string& arg);

/// The remote command line of one agent.
std::string agent_command(const ssh_options& o, const ssh_host& h);

/// --launcher and its options as the driver's command line gave them.
struct launcher_config {
  std::string kind = "none";          // none, ssh or slurm
  std::string ssh_command = "ssh";    // --ssh-command
  int ssh_port = 0;                   // --ssh-port
  std::string ssh_identity;           // --ssh-identity-file
  std::vector<std::string> ssh_extra; // --ssh-option, each
  std::string agent_path;             // --agent-path ("": caf-hvd next to this binary)
  std::string srun_command = "srun";  // --srun-command
  double link_timeout = 0;            // the driver's --link-timeout, the agents' too
};

/// What --launcher ssh and --launcher slurm share: the agent binary, the credentials the
/// agents use (`cluster_dir`, "" = insecure), the shim that ties the launcher to this
/// process, the deadline; and the client (with its options) that `l.kind` names.
ssh_options launcher_options(const launcher_config& l, const std::string& cluster_dir,
                             const std::string& shim, std::chrono::milliseconds timeout);

/// A host that gets ranks, as a launcher sees it.
struct launch_target {
  std::string host;    // as the job names it (ssh reaches it so: USER@HOST allowed)
  std::string address; // its IPv4 address (the agent binds to it)
  uint16_t port = 0;   // where its agent listens; a started agent's port replaces it
};

/// Parses an agent's first line ("caf-hvd node 'N' listening on ADDR:PORT (...)"); 0 if it
/// is not that line.
uint16_t parse_listening_port(const std::string& line);

/// One launcher process (ssh or srun) whose stdin keeps its agents alive and whose
/// output names their ports (defined in ssh_launch.cpp).
struct agent_session;

class ssh_agents {
public:
  /// Starts an agent on every host; returns when each printed its port, failed, or the
  /// timeout passed. results[i] belongs to hosts[i].
  ssh_agents(const ssh_options& o, const std::vector<ssh_host>& hosts,
             std::vector<ssh_result>& results);
  /// Ends every session (stdin closes: the agents stop their ranks and exit), waits for
  /// the ssh clients up to `grace`, then kills them.
  ~ssh_agents();
  ssh_agents(const ssh_agents&) = delete;
  ssh_agents& operator=(const ssh_agents&) = delete;

private:
  std::vector<std::shared_ptr<agent_session>> sessions_;
};

/// Agents for one job as one Slurm step: `srun --nodes=N --ntasks-per-node=1 --overlap
/// --input=all --label caf-hvd node --port 0 --exit-on-stdin-eof ...`; each task's agent
/// names itself after its node's hostname, and its port is read from the step's output.
class srun_agents {
public:
  /// `names`: the allocation's nodes (their hostnames); ports[i] belongs to names[i]
  /// (0: it did not report; `error` then says what srun said).
  srun_agents(const ssh_options& o, const std::vector<std::string>& names,
              std::vector<uint16_t>& ports, std::string& error);
  /// Closes the step's stdin (every agent stops and exits), waits, then kills srun.
  ~srun_agents();
  srun_agents(const srun_agents&) = delete;
  srun_agents& operator=(const srun_agents&) = delete;

private:
  std::shared_ptr<agent_session> step_;
};

/// --launcher ssh: an agent on every target, unless one already answers at the target's
/// port; all sessions at once (`o.parallel` at a time). Sets the ports of the agents it
/// started and returns "", or every failure ("\n  host H: why" each); `agents` then
/// holds the sessions (null when every target had an agent), for the caller to end.
std::string start_agents_over_ssh(const ssh_options& o, std::vector<launch_target>& targets,
                                  std::unique_ptr<ssh_agents>& agents);

/// --launcher slurm: an agent on every target as one srun step, each named after its
/// host. Sets the targets' ports and returns "", or what srun said; `step` holds the
/// step either way, for the caller to end.
std::string start_agents_over_srun(const ssh_options& o, std::vector<launch_target>& targets,
                                   std::unique_ptr<srun_agents>& step);

/// "NAME PORT" from one line of the step's labelled output ("3: caf-hvd node 'n3'
/// listening on *:40123 (...)"); port 0 if it is not such a line.
std::pair<std::string, uint16_t> parse_step_line(const std::string& line);

} // namespace cafhvd

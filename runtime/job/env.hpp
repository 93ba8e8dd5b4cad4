// The environment contract between caf-hvd and the programs it launches: Horovod's
// variables, torch.distributed's `env://` variables, and the user's additions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cafhvd {

/// Everything that decides one rank's environment.
struct rank_env_input {
  int rank = 0, size = 1, local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  int group_rank = 0;                   // index of the rank's host among the job's hosts
  std::string hostname;                 // the node's name (HOROVOD_HOSTNAME)
  std::string master_addr;              // address of rank 0's host reachable by every host
  int master_port = 0;                  // a port that was free on rank 0's host
  std::string iface;                    // interface for Gloo/NCCL on this rank's host ("" = unset)
  std::vector<std::string> nccl_ifaces; // usable interfaces of this host, in order
  std::string rendezvous_addr;          // HOROVOD_GLOO_RENDEZVOUS_ADDR ("" until the server exists)
  int rendezvous_port = 0;
  bool agent_store = false;       // MASTER_PORT is served by the launcher's torch store
                                  // (else rank 0 serves it; USE_LIBUV=0 unless given)
  int restart_count = 0;          // TORCHELASTIC_RESTART_COUNT (elastic: the generation index)
  // GPU jobs: the devices this rank sees (CUDA_VISIBLE_DEVICES, PCI bus order), and
  // --cpus-per-slot (OMP_NUM_THREADS); both yield to the user's own values
  std::optional<std::string> cuda_visible_devices;
  int cpus_per_slot = 0;
  std::vector<std::string> base;  // inherited KEY=VALUE pairs (the driver's environment)
  std::vector<std::string> extra; // the user's --env KEY=VALUE pairs
};

/// Builds the rank's full environment as KEY=VALUE strings sorted by key. Precedence,
/// lowest first: inherited variables, interface variables, the user's --env, and the
/// rank identity (ranks, sizes, hostname, master address), which nothing overrides.
std::vector<std::string> build_rank_env(const rank_env_input& in);

/// Validates one `--env` argument: KEY=VALUE with KEY a shell identifier. Throws
/// std::invalid_argument naming the argument otherwise.
std::pair<std::string, std::string> parse_env_assignment(std::string_view text);

/// The variables of `environ` worth forwarding to ranks on other hosts: everything
/// except per-shell and per-host state (PWD, OLDPWD, SHLVL, HOSTNAME, _, BASH_FUNC_*)
/// and the head node's devices (CUDA_VISIBLE_DEVICES: devices are given per node).
std::vector<std::string> forwardable_environment(char** envp);

/// Value of KEY in a KEY=VALUE list, if present.
std::optional<std::string> env_lookup(const std::vector<std::string>& env, std::string_view key);

} // namespace cafhvd

// Hosts from a batch system's allocation: Slurm's hostlist syntax and task counts, PBS's
// node file, LSF's host list. Plain parsers that explain their errors.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/job/host_spec.hpp"

namespace cafhvd {

/// At most this many hosts come out of one hostlist (a typo such as n[1-99999999]
/// must not exhaust memory).
inline constexpr size_t max_hostlist_hosts = 1 << 20;

/// Expands a Slurm hostlist as `scontrol show hostnames` does: comma-separated items
/// (commas inside brackets belong to the brackets), each a name with any number of
/// bracket groups of numbers and ranges (`tux[0-5,12,20-25]`, `n[001-128]` keeps the
/// zero padding of the range's first number, `rack[1-2]-node[01-02]` is the cartesian
/// product in order). Throws spec_error naming the problem.
std::vector<std::string> expand_hostlist(std::string_view text);

/// Expands SLURM_TASKS_PER_NODE (`2(x3),1` -> 2,2,2,1). Throws spec_error.
std::vector<uint32_t> expand_tasks_per_node(std::string_view text);

/// Where a job's hosts came from and what they are.
struct allocation {
  std::string source; // "Slurm job 1234 (SLURM_JOB_NODELIST)", "PBS_NODEFILE /path", ...
  std::vector<host_spec> hosts;
};

/// The allocation the process runs in, from its environment (`getenv` by default):
/// Slurm (SLURM_JOB_ID with SLURM_JOB_NODELIST or SLURM_NODELIST, slots from
/// SLURM_TASKS_PER_NODE, else one per node), PBS (PBS_NODEFILE: one line per slot) or
/// LSF (LSB_MCPU_HOSTS: "host slots host slots ..."); nullopt outside any. Agents are
/// expected at `port`. Throws spec_error for an allocation that does not parse or is
/// empty.
std::optional<allocation> detect_allocation(
    uint16_t port = default_node_port,
    const std::function<const char*(const char*)>& env = nullptr);

/// The node addresses in `sinfo -h -N -o '%N %o'` output ("NAME NODEADDR" per line):
/// NAME -> NODEADDR; a node whose address is "(null)" is left out.
std::map<std::string, std::string> parse_slurm_node_addresses(const std::string& sinfo_output);

/// The allocation's node addresses as Slurm knows them (NodeAddr), from one run of
/// sinfo; empty when sinfo is missing or fails.
std::map<std::string, std::string> slurm_node_addresses();

} // namespace cafhvd

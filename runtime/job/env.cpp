// Builds per-rank environments; keeps one precedence order so that no caller mutates
// a shared settings map (a fault of Horovod's runner).
#include "runtime/job/env.hpp"

#include <map>
#include <stdexcept>

#include <fmt/format.h>

namespace cafhvd {

namespace {

bool valid_key(std::string_view key) {
  if (key.empty() || (key[0] >= '0' && key[0] <= '9'))
    return false;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return false;
  return true;
}

void put_all(std::map<std::string, std::string>& env, const std::vector<std::string>& kvs) {
  for (auto& kv : kvs) {
    auto eq = kv.find('=');
    if (eq != std::string::npos && eq > 0)
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
}

} // namespace

std::pair<std::string, std::string> parse_env_assignment(std::string_view text) {
  auto eq = text.find('=');
  if (eq == std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("--env '{}': expected KEY=VALUE (the '=' is missing)", text));
  auto key = text.substr(0, eq);
  if (!valid_key(key))
    throw std::invalid_argument(fmt::format(
        "--env '{}': '{}' is not a valid variable name (letters, digits, '_', not starting "
        "with a digit)",
        text, key));
  return {std::string{key}, std::string{text.substr(eq + 1)}};
}

std::vector<std::string> forwardable_environment(char** envp) {
  static const char* skipped[] = {"PWD",      "OLDPWD", "SHLVL",
                                  "HOSTNAME", "_",      "CUDA_VISIBLE_DEVICES"};
  std::vector<std::string> out;
  for (auto p = envp; p && *p; ++p) {
    std::string_view kv = *p;
    auto key = kv.substr(0, kv.find('='));
    bool skip = key.rfind("BASH_FUNC_", 0) == 0;
    for (auto s : skipped)
      skip = skip || key == s;
    if (!skip && kv.find('=') != std::string_view::npos)
      out.emplace_back(kv);
  }
  return out;
}

std::optional<std::string> env_lookup(const std::vector<std::string>& env, std::string_view key) {
  for (auto& kv : env)
    if (kv.size() > key.size() && kv[key.size()] == '=' && kv.compare(0, key.size(), key) == 0)
      return kv.substr(key.size() + 1);
  return std::nullopt;
}

std::vector<std::string> build_rank_env(const rank_env_input& in) {
  std::map<std::string, std::string> env;
  put_all(env, in.base);
  if (!in.iface.empty()) {
    env["HOROVOD_GLOO_IFACE"] = in.iface;
    env["GLOO_SOCKET_IFNAME"] = in.iface;
    std::string joined;
    for (auto& n : in.nccl_ifaces)
      joined += (joined.empty() ? "" : ",") + n;
    env["NCCL_SOCKET_IFNAME"] = joined.empty() ? in.iface : joined;
  }
  env["HOROVOD_CONTROLLER"] = "gloo";
  env["HOROVOD_CPU_OPERATIONS"] = "gloo";
  if (in.cuda_visible_devices) {
    env["CUDA_VISIBLE_DEVICES"] = *in.cuda_visible_devices;
    // device indices as nvidia-smi and NVML count them, not CUDA's fastest-first order
    env.emplace("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    env.emplace("HOROVOD_GPU_OPERATIONS", "NCCL");
  }
  if (in.cpus_per_slot > 0)
    env.emplace("OMP_NUM_THREADS", std::to_string(in.cpus_per_slot));
  put_all(env, in.extra);
  auto s = [](int v) { return std::to_string(v); };
  env["HOROVOD_RANK"] = s(in.rank);
  env["HOROVOD_SIZE"] = s(in.size);
  env["HOROVOD_LOCAL_RANK"] = s(in.local_rank);
  env["HOROVOD_LOCAL_SIZE"] = s(in.local_size);
  env["HOROVOD_CROSS_RANK"] = s(in.cross_rank);
  env["HOROVOD_CROSS_SIZE"] = s(in.cross_size);
  env["HOROVOD_HOSTNAME"] = in.hostname;
  if (!in.rendezvous_addr.empty()) {
    env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = in.rendezvous_addr;
    env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = s(in.rendezvous_port);
  }
  env["RANK"] = s(in.rank);
  env["WORLD_SIZE"] = s(in.size);
  env["LOCAL_RANK"] = s(in.local_rank);
  env["LOCAL_WORLD_SIZE"] = s(in.local_size);
  env["GROUP_RANK"] = s(in.group_rank);
  env["MASTER_ADDR"] = in.master_addr;
  env["MASTER_PORT"] = s(in.master_port);
  if (in.agent_store) {
    // As under torchrun: env:// makes every rank a client of the store at MASTER_PORT.
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    env["TORCHELASTIC_RESTART_COUNT"] = s(in.restart_count);
  } else {
    // Rank 0's torch starts its own store. torch 2.4+ builds it on libuv unless
    // USE_LIBUV=0, and a torch built without libuv (Debian's) then fails; the other
    // backend is in every build. The user's or the driver's own value wins.
    env.emplace("USE_LIBUV", "0");
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (auto& [k, v] : env) {
    // append() rather than k + "=" + v, which trips GCC 12's -Wrestrict at -O3.
    std::string kv;
    kv.reserve(k.size() + 1 + v.size());
    kv.append(k).append(1, '=').append(v);
    out.push_back(std::move(kv));
  }
  return out;
}

} // namespace cafhvd

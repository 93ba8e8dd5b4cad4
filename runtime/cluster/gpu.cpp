// GPU inventory and lending (see gpu.hpp).
#include "runtime/cluster/gpu.hpp"

#include "runtime/job/host_spec.hpp"

#include <algorithm>
#include <cstdio>
#include <dlfcn.h>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace cafhvd {

std::vector<int32_t> parse_gpu_list(std::string_view text) {
  if (text == "none")
    return {};
  std::vector<int32_t> out;
  std::set<int32_t> seen;
  for (auto item : split_on(text, ',')) {
    if (item.empty() || item.size() > 4
        || !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw std::invalid_argument(
          fmt::format("--gpus '{}': '{}' is not a device index (expected e.g. 0,1,2,3 or none)",
                      text, item));
    auto v = static_cast<int32_t>(std::stoi(std::string{item}));
    if (!seen.insert(v).second)
      throw std::invalid_argument(fmt::format("--gpus '{}': device {} is listed twice", text, v));
    out.push_back(v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> parse_nvidia_smi_list(std::string_view text) {
  std::vector<int32_t> out;
  for (auto line : split_on(text, '\n')) {
    int idx = -1;
    if (line.rfind("GPU ", 0) == 0 && std::sscanf(std::string{line}.c_str(), "GPU %d:", &idx) == 1
        && idx >= 0)
      out.push_back(idx);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

// NVML's C API, resolved at run time so that caf-hvd needs no CUDA package.
bool nvml_count(unsigned& count) {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    return false;
  using init_fn = int (*)();
  using count_fn = int (*)(unsigned*);
  auto init = reinterpret_cast<init_fn>(::dlsym(lib, "nvmlInit_v2"));
  auto get = reinterpret_cast<count_fn>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<init_fn>(::dlsym(lib, "nvmlShutdown"));
  bool ok = init && get && init() == 0;
  if (ok) {
    ok = get(&count) == 0;
    if (shutdown)
      shutdown();
  }
  ::dlclose(lib);
  return ok;
}

} // namespace

gpu_inventory detect_gpus() {
  unsigned n = 0;
  if (nvml_count(n)) {
    gpu_inventory inv{{}, "NVML"};
    for (unsigned i = 0; i < n; ++i)
      inv.devices.push_back(static_cast<int32_t>(i));
    return inv;
  }
  if (FILE* p = ::popen("nvidia-smi -L 2>/dev/null", "r")) {
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0)
      text.append(buf, got);
    if (::pclose(p) == 0) {
      auto devices = parse_nvidia_smi_list(text);
      if (!devices.empty())
        return {devices, "nvidia-smi"};
    }
  }
  return {{}, "none found"};
}

std::string join_devices(const std::vector<int32_t>& devices) {
  return fmt::format("{}", fmt::join(devices, ","));
}

std::vector<int32_t> gpu_pool::free() const {
  std::lock_guard g{m_};
  return free_locked();
}

std::vector<int32_t> gpu_pool::free_locked() const {
  std::vector<int32_t> out;
  for (auto d : devices_) {
    bool taken = false;
    for (auto& [owner, held] : lent_)
      taken = taken || std::find(held.begin(), held.end(), d) != held.end();
    if (!taken)
      out.push_back(d);
  }
  return out;
}

std::vector<int32_t> gpu_pool::lend(uint64_t owner, size_t count, std::string& why) {
  std::lock_guard g{m_};
  auto available = free_locked();
  if (available.size() < count) {
    auto others = lent_to_others_locked(owner);
    why = fmt::format("{} GPU{} wanted, {} free ({} on this node, {} lent to other jobs)", count,
                      count == 1 ? "" : "s", available.size(), devices_.size(), others);
    return {};
  }
  auto& held = lent_[owner];
  held.insert(held.end(), available.begin(), available.begin() + static_cast<long>(count));
  std::sort(held.begin(), held.end());
  return held;
}

void gpu_pool::release(uint64_t owner) {
  std::lock_guard g{m_};
  lent_.erase(owner);
}

size_t gpu_pool::lent_to_others(uint64_t owner) const {
  std::lock_guard g{m_};
  return lent_to_others_locked(owner);
}

size_t gpu_pool::lent_to_others_locked(uint64_t owner) const {
  size_t n = 0;
  for (auto& [o, held] : lent_)
    if (o != owner)
      n += held.size();
  return n;
}

} // namespace cafhvd

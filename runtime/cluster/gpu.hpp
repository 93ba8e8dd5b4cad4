// A node's GPUs: what it has (declared with --gpus, else NVML, else nvidia-smi, else
// none) and which of them are lent to which job, so that two jobs on one agent never
// share a device and a job's devices come back when its ranks are gone.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace cafhvd {

struct gpu_inventory {
  std::vector<int32_t> devices; // CUDA device indices (PCI bus order), ascending
  std::string source;           // "--gpus", "NVML", "nvidia-smi" or "none found"
};

/// `--gpus LIST`: comma-separated distinct device indices, or "none". Throws
/// std::invalid_argument naming the bad entry.
std::vector<int32_t> parse_gpu_list(std::string_view text);

/// Device indices from `nvidia-smi -L` output ("GPU 0: NVIDIA A100 (UUID: GPU-...)").
std::vector<int32_t> parse_nvidia_smi_list(std::string_view text);

/// The devices of this machine: NVML through libnvidia-ml.so.1 when it loads, else
/// `nvidia-smi -L` when it runs, else none.
gpu_inventory detect_gpus();

/// "0,1,3" (empty for none).
std::string join_devices(const std::vector<int32_t>& devices);

/// Lends devices per job (owner); thread-safe.
class gpu_pool {
public:
  explicit gpu_pool(std::vector<int32_t> devices = {}) : devices_(std::move(devices)) {}
  const std::vector<int32_t>& devices() const { return devices_; }
  /// Devices no job holds, ascending.
  std::vector<int32_t> free() const;
  /// Lends `count` free devices (the lowest) to `owner`, in addition to what it holds.
  /// Returns the owner's devices now, or an empty vector and `why` when too few are free.
  std::vector<int32_t> lend(uint64_t owner, size_t count, std::string& why);
  /// Everything `owner` holds comes back.
  void release(uint64_t owner);
  /// Devices lent to owners other than `owner`.
  size_t lent_to_others(uint64_t owner) const;

private:
  std::vector<int32_t> free_locked() const;
  size_t lent_to_others_locked(uint64_t owner) const;
  mutable std::mutex m_;
  std::vector<int32_t> devices_;
  std::map<uint64_t, std::vector<int32_t>> lent_;
};

} // namespace cafhvd

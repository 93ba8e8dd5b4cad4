#include "runtime/job/horovod_knobs.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace cafhvd {

namespace {

// The config file's sections and keys, and the argument each key sets (config_parser.py).
struct key_map {
  const char* section;
  const char* key;
  const char* arg;
};

constexpr key_map config_keys[] = {
    {"params", "fusion_threshold_mb", "fusion_threshold_mb"},
    {"params", "cycle_time_ms", "cycle_time_ms"},
    {"params", "cache_capacity", "cache_capacity"},
    {"params", "hierarchical_allreduce", "hierarchical_allreduce"},
    {"params", "hierarchical_allgather", "hierarchical_allgather"},
    {"params", "torus_allreduce", "torus_allreduce"},
    {"autotune", "enabled", "autotune"},
    {"autotune", "log_file", "autotune_log_file"},
    {"autotune", "warmup_samples", "autotune_warmup_samples"},
    {"autotune", "steps_per_sample", "autotune_steps_per_sample"},
    {"autotune", "bayes_opt_max_samples", "autotune_bayes_opt_max_samples"},
    {"autotune", "gaussian_process_noise", "autotune_gaussian_process_noise"},
    {"timeline", "filename", "timeline_filename"},
    {"timeline", "mark_cycles", "timeline_mark_cycles"},
    {"stall_check", "enabled", "no_stall_check"}, // negated
    {"stall_check", "warning_time_seconds", "stall_check_warning_time_seconds"},
    {"stall_check", "shutdown_time_seconds", "stall_check_shutdown_time_seconds"},
    {"library_options", "mpi_threads_disable", "mpi_threads_disable"},
    {"library_options", "num_nccl_streams", "num_nccl_streams"},
    {"library_options", "thread_affinity", "thread_affinity"},
    {"library_options", "gloo_timeout_seconds", "gloo_timeout_seconds"},
    {"logging", "level", "log_level"},
    {"logging", "with_timestamp", "log_with_timestamp"},
};

const std::vector<std::string> switches{
    "hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
    "autotune",               "timeline_mark_cycles",   "no_stall_check",
    "mpi_threads_disable",    "log_with_timestamp",     "tcp_flag"};

bool is_switch(const std::string& arg) {
  return std::find(switches.begin(), switches.end(), arg) != switches.end();
}

std::string flag_of(const std::string& arg) {
  std::string f = arg;
  std::replace(f.begin(), f.end(), '_', '-');
  return "--" + f;
}

// YAML 1.1's spellings of a boolean, as PyYAML reads them for horovodrun.
std::string yaml_bool(const YAML::Node& n, const std::string& where) {
  std::string s = n.as<std::string>();
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  if (l == "true" || l == "yes" || l == "on")
    return "true";
  if (l == "false" || l == "no" || l == "off")
    return "false";
  throw std::invalid_argument(fmt::format("{}: '{}' is not true or false", where, s));
}

double number(const horovod_knobs& k, const std::string& arg) {
  const auto& s = k.values.at(arg);
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty() || !std::isfinite(v))
    throw std::invalid_argument(fmt::format("{} '{}' is not a number", flag_of(arg), s));
  return v;
}

long whole(const horovod_knobs& k, const std::string& arg) {
  double v = number(k, arg);
  if (v != std::floor(v))
    throw std::invalid_argument(
        fmt::format("{} '{}' is not a whole number", flag_of(arg), k.values.at(arg)));
  return static_cast<long>(v);
}

bool on(const horovod_knobs& k, const std::string& arg) {
  auto it = k.values.find(arg);
  return it != k.values.end() && it->second == "true";
}

} // namespace

void read_horovod_config(const std::string& text, const std::string& path, horovod_knobs& knobs) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(fmt::format("--config-file {}: not YAML: {}", path, e.what()));
  }
  if (root.IsNull())
    return; // an empty file sets nothing, as in horovodrun
  if (!root.IsMap())
    throw std::invalid_argument(
        fmt::format("--config-file {}: expected a mapping of sections (params, autotune, "
                    "timeline, stall_check, library_options, logging, controller)",
                    path));
  try {
    for (auto section : root) {
      auto name = section.first.as<std::string>();
      if (name == "controller") {
        auto c = section.second.as<std::string>();
        std::string l = c;
        std::transform(l.begin(), l.end(), l.begin(), ::tolower);
        if (l == "mpi")
          throw std::invalid_argument(fmt::format(
              "--config-file {}: controller: mpi is not supported: caf-hvd runs Gloo jobs only",
              path));
        if (l != "gloo")
          throw std::invalid_argument(
              fmt::format("--config-file {}: No such controller supported: {}", path, c));
        continue;
      }
      bool known_section = false;
      for (auto& k : config_keys)
        known_section = known_section || name == k.section;
      if (!known_section)
        throw std::invalid_argument(fmt::format(
            "--config-file {}: unknown section '{}' (horovodrun's are params, autotune, "
            "timeline, stall_check, library_options, logging and controller)",
            path, name));
      if (section.second.IsNull())
        continue;
      if (!section.second.IsMap())
        throw std::invalid_argument(
            fmt::format("--config-file {}: section '{}' is not a mapping of keys", path, name));
      for (auto entry : section.second) {
        auto key = entry.first.as<std::string>();
        const key_map* found = nullptr;
        std::string known;
        for (auto& k : config_keys)
          if (name == k.section) {
            known += (known.empty() ? "" : ", ") + std::string{k.key};
            if (key == k.key)
              found = &k;
          }
        if (!found)
          throw std::invalid_argument(fmt::format(
              "--config-file {}: unknown key '{}' in section '{}' (its keys: {})", path, key,
              name, known));
        if (entry.second.IsNull())
          continue; // as horovodrun: a key without a value sets nothing
        if (!entry.second.IsScalar())
          throw std::invalid_argument(
              fmt::format("--config-file {}: {}.{} is not a single value", path, name, key));
        auto where = fmt::format("--config-file {}: {}.{}", path, name, key);
        std::string value = is_switch(found->arg) ? yaml_bool(entry.second, where)
                                                  : entry.second.as<std::string>();
        if (std::string{found->arg} == "no_stall_check")
          value = value == "true" ? "false" : "true"; // stall_check.enabled
        knobs.fill(found->arg, value);
      }
    }
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(fmt::format("--config-file {}: {}", path, e.what()));
  }
}

std::vector<std::string> horovod_env(const horovod_knobs& k) {
  std::vector<std::string> env;
  auto set = [&](const char* key, const std::string& value) {
    env.push_back(fmt::format("{}={}", key, value));
  };
  auto nonnegative = [&](const std::string& arg) {
    double v = number(k, arg);
    if (v < 0)
      throw std::invalid_argument(
          fmt::format("{} {} must be >= 0", flag_of(arg), k.values.at(arg)));
    return v;
  };
  auto nonnegative_whole = [&](const std::string& arg) {
    nonnegative(arg);
    return std::to_string(whole(k, arg));
  };
  auto flag01 = [&](const std::string& arg) { return on(k, arg) ? "1" : "0"; };

  if (k.has("fusion_threshold_mb"))
    set("HOROVOD_FUSION_THRESHOLD",
        std::to_string(static_cast<long long>(nonnegative("fusion_threshold_mb") * 1024 * 1024)));
  if (k.has("cycle_time_ms")) {
    nonnegative("cycle_time_ms");
    set("HOROVOD_CYCLE_TIME", k.values.at("cycle_time_ms"));
  }
  if (k.has("cache_capacity"))
    set("HOROVOD_CACHE_CAPACITY", nonnegative_whole("cache_capacity"));
  if (k.has("hierarchical_allreduce"))
    set("HOROVOD_HIERARCHICAL_ALLREDUCE", flag01("hierarchical_allreduce"));
  if (k.has("hierarchical_allgather"))
    set("HOROVOD_HIERARCHICAL_ALLGATHER", flag01("hierarchical_allgather"));
  if (k.has("torus_allreduce"))
    set("HOROVOD_TORUS_ALLREDUCE", flag01("torus_allreduce"));
  // autotune's own settings count only with autotune on, as in horovodrun
  if (k.has("autotune_gaussian_process_noise")) {
    double noise = number(k, "autotune_gaussian_process_noise");
    if (noise < 0 || noise > 1)
      throw std::invalid_argument(fmt::format("--autotune-gaussian-process-noise {} must be in "
                                              "[0, 1]",
                                              k.values.at("autotune_gaussian_process_noise")));
  }
  for (auto arg : {"autotune_warmup_samples", "autotune_steps_per_sample",
                   "autotune_bayes_opt_max_samples"})
    if (k.has(arg))
      nonnegative_whole(arg);
  if (on(k, "autotune")) {
    set("HOROVOD_AUTOTUNE", "1");
    if (k.has("autotune_log_file"))
      set("HOROVOD_AUTOTUNE_LOG", k.values.at("autotune_log_file"));
    if (k.has("autotune_warmup_samples"))
      set("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", nonnegative_whole("autotune_warmup_samples"));
    if (k.has("autotune_steps_per_sample"))
      set("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", nonnegative_whole("autotune_steps_per_sample"));
    if (k.has("autotune_bayes_opt_max_samples"))
      set("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
          nonnegative_whole("autotune_bayes_opt_max_samples"));
    if (k.has("autotune_gaussian_process_noise"))
      set("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
          k.values.at("autotune_gaussian_process_noise"));
  }
  if (k.has("timeline_filename") && !k.values.at("timeline_filename").empty()) {
    set("HOROVOD_TIMELINE", k.values.at("timeline_filename"));
    set("HOROVOD_TIMELINE_MARK_CYCLES", flag01("timeline_mark_cycles"));
  }
  if (k.has("no_stall_check"))
    set("HOROVOD_STALL_CHECK_DISABLE", flag01("no_stall_check"));
  if (k.has("stall_check_warning_time_seconds"))
    set("HOROVOD_STALL_CHECK_TIME_SECONDS", nonnegative_whole("stall_check_warning_time_seconds"));
  if (k.has("stall_check_shutdown_time_seconds"))
    set("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
        nonnegative_whole("stall_check_shutdown_time_seconds"));
  if (k.has("mpi_threads_disable"))
    set("HOROVOD_MPI_THREADS_DISABLE", flag01("mpi_threads_disable"));
  if (k.has("num_nccl_streams"))
    set("HOROVOD_NUM_NCCL_STREAMS", nonnegative_whole("num_nccl_streams"));
  if (on(k, "tcp_flag"))
    set("NCCL_IB_DISABLE", "1");
  if (k.has("thread_affinity"))
    set("HOROVOD_THREAD_AFFINITY", nonnegative_whole("thread_affinity"));
  if (k.has("gloo_timeout_seconds")) {
    if (whole(k, "gloo_timeout_seconds") < 1)
      throw std::invalid_argument("--gloo-timeout-seconds must be at least 1");
    set("HOROVOD_GLOO_TIMEOUT_SECONDS", std::to_string(whole(k, "gloo_timeout_seconds")));
  }
  if (k.has("log_level")) {
    static const std::vector<std::string> levels{"TRACE",   "DEBUG", "INFO",
                                                 "WARNING", "ERROR", "FATAL"};
    std::string level = k.values.at("log_level");
    std::transform(level.begin(), level.end(), level.begin(), ::toupper);
    if (std::find(levels.begin(), levels.end(), level) == levels.end())
      throw std::invalid_argument(fmt::format("--log-level '{}': expected one of TRACE, DEBUG, "
                                              "INFO, WARNING, ERROR, FATAL",
                                              k.values.at("log_level")));
    set("HOROVOD_LOG_LEVEL", level);
  }
  if (k.has("log_with_timestamp"))
    set("HOROVOD_LOG_HIDE_TIME", on(k, "log_with_timestamp") ? "0" : "1");
  return env;
}

} // namespace cafhvd

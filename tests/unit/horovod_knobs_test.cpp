// horovodrun's tuning knobs: its flags and its YAML config file become the ranks'
// HOROVOD_* variables as horovodrun's set_env_from_args makes them.
#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

#include "runtime/job/horovod_knobs.hpp"

using namespace cafhvd;

namespace {

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string error_of(const horovod_knobs& k) {
  try {
    horovod_env(k);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::string config_error(const std::string& text) {
  horovod_knobs k;
  try {
    read_horovod_config(text, "c.yaml", k);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("horovodrun's config file sets every knob its sections name, as its env") {
  // the example config of Horovod's docs (docs/runner.rst's --config-file), every key
  const char* yaml = R"(
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: false
  hierarchical_allgather: true
  torus_allreduce: yes
autotune:
  enabled: true
  log_file: /tmp/autotune_log.csv
  warmup_samples: 5
  steps_per_sample: 20
  bayes_opt_max_samples: 50
  gaussian_process_noise: 0.9
timeline:
  filename: /tmp/timeline.json
  mark_cycles: true
stall_check:
  enabled: false
  warning_time_seconds: 120
  shutdown_time_seconds: 240
library_options:
  mpi_threads_disable: true
  num_nccl_streams: 2
  thread_affinity: 1
  gloo_timeout_seconds: 60
logging:
  level: warning
  with_timestamp: false
controller: gloo
)";
  horovod_knobs k;
  read_horovod_config(yaml, "c.yaml", k);
  CHECK(sorted(horovod_env(k))
        == sorted({"HOROVOD_FUSION_THRESHOLD=33554432",
                   "HOROVOD_CYCLE_TIME=10",
                   "HOROVOD_CACHE_CAPACITY=2048",
                   "HOROVOD_HIERARCHICAL_ALLREDUCE=0",
                   "HOROVOD_HIERARCHICAL_ALLGATHER=1",
                   "HOROVOD_TORUS_ALLREDUCE=1",
                   "HOROVOD_AUTOTUNE=1",
                   "HOROVOD_AUTOTUNE_LOG=/tmp/autotune_log.csv",
                   "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=5",
                   "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=20",
                   "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=50",
                   "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE=0.9",
                   "HOROVOD_TIMELINE=/tmp/timeline.json",
                   "HOROVOD_TIMELINE_MARK_CYCLES=1",
                   "HOROVOD_STALL_CHECK_DISABLE=1",
                   "HOROVOD_STALL_CHECK_TIME_SECONDS=120",
                   "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=240",
                   "HOROVOD_MPI_THREADS_DISABLE=1",
                   "HOROVOD_NUM_NCCL_STREAMS=2",
                   "HOROVOD_THREAD_AFFINITY=1",
                   "HOROVOD_GLOO_TIMEOUT_SECONDS=60",
                   "HOROVOD_LOG_LEVEL=WARNING",
                   "HOROVOD_LOG_HIDE_TIME=1"}));
}

TEST_CASE("horovodrun's flags win over its config file; unset knobs set nothing") {
  horovod_knobs k;
  k.fill("cycle_time_ms", "3");      // --cycle-time-ms 3
  k.fill("no_stall_check", "false"); // --stall-check
  read_horovod_config("params:\n  cycle_time_ms: 10\n  cache_capacity: 7\n"
                      "stall_check:\n  enabled: false\n",
                      "c.yaml", k);
  CHECK(sorted(horovod_env(k)) == sorted({"HOROVOD_CYCLE_TIME=3", "HOROVOD_CACHE_CAPACITY=7",
                                          "HOROVOD_STALL_CHECK_DISABLE=0"}));
  CHECK(horovod_env(horovod_knobs{}).empty());
  horovod_knobs empty_file;
  read_horovod_config("", "c.yaml", empty_file);
  CHECK(empty_file.values.empty());
}

TEST_CASE("autotune's settings count only with autotune on; mark_cycles only with a timeline; "
          "--tcp disables InfiniBand for NCCL") {
  horovod_knobs k;
  k.fill("autotune_warmup_samples", "5");
  k.fill("timeline_mark_cycles", "true");
  k.fill("tcp_flag", "true");
  CHECK(horovod_env(k) == std::vector<std::string>{"NCCL_IB_DISABLE=1"});
  k.fill("autotune", "true");
  k.fill("timeline_filename", "/tmp/t.json");
  CHECK(sorted(horovod_env(k))
        == sorted({"HOROVOD_AUTOTUNE=1", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=5",
                   "HOROVOD_TIMELINE=/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES=1",
                   "NCCL_IB_DISABLE=1"}));
}

TEST_CASE("values horovodrun refuses are refused, named by their flag") {
  auto with = [](const char* arg, const char* value) {
    horovod_knobs k;
    k.fill(arg, value);
    return error_of(k);
  };
  CHECK(with("fusion_threshold_mb", "-1") == "--fusion-threshold-mb -1 must be >= 0");
  CHECK(with("cache_capacity", "many") == "--cache-capacity 'many' is not a number");
  CHECK(with("num_nccl_streams", "1.5") == "--num-nccl-streams '1.5' is not a whole number");
  CHECK(with("autotune_gaussian_process_noise", "1.5")
        == "--autotune-gaussian-process-noise 1.5 must be in [0, 1]");
  CHECK(with("gloo_timeout_seconds", "0") == "--gloo-timeout-seconds must be at least 1");
  CHECK(with("log_level", "LOUD")
        == "--log-level 'LOUD': expected one of TRACE, DEBUG, INFO, WARNING, ERROR, FATAL");
  CHECK(with("stall_check_warning_time_seconds", "-5")
        == "--stall-check-warning-time-seconds -5 must be >= 0");
}

TEST_CASE("a config file that is not horovodrun's is refused naming the key") {
  CHECK(config_error("params: [1, 2]\n") == "--config-file c.yaml: section 'params' is not a "
                                            "mapping of keys");
  CHECK(config_error("parms:\n  cycle_time_ms: 1\n")
        == "--config-file c.yaml: unknown section 'parms' (horovodrun's are params, autotune, "
           "timeline, stall_check, library_options, logging and controller)");
  CHECK(config_error("params:\n  cycle_time: 1\n")
        == "--config-file c.yaml: unknown key 'cycle_time' in section 'params' (its keys: "
           "fusion_threshold_mb, cycle_time_ms, cache_capacity, hierarchical_allreduce, "
           "hierarchical_allgather, torus_allreduce)");
  CHECK(config_error("params:\n  torus_allreduce: maybe\n")
        == "--config-file c.yaml: params.torus_allreduce: 'maybe' is not true or false");
  CHECK(config_error("controller: mpi\n")
        == "--config-file c.yaml: controller: mpi is not supported: caf-hvd runs Gloo jobs only");
  CHECK(config_error("controller: nccl\n")
        == "--config-file c.yaml: No such controller supported: nccl");
  CHECK(config_error("- a\n- b\n").find("expected a mapping of sections") != std::string::npos);
  CHECK(config_error("params: {\n").rfind("--config-file c.yaml: not YAML: ", 0) == 0);
}

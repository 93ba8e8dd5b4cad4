// horovodrun's tuning knobs: its command-line flags and its --config-file (a YAML file),
// which horovodrun turns into HOROVOD_* variables of every rank
// (horovod/runner/common/util/config_parser.py in Horovod 0.28.1). Flags given on the
// command line win over the file, as in horovodrun.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace cafhvd {

/// The knobs by horovodrun's argument names (`fusion_threshold_mb`, `no_stall_check`,
/// `log_with_timestamp`, ...); switches are "true" or "false".
struct horovod_knobs {
  std::map<std::string, std::string> values;

  bool has(const std::string& name) const { return values.count(name) > 0; }
  /// Sets `name` unless it is set already (the command line came first).
  void fill(const std::string& name, const std::string& value) { values.emplace(name, value); }
};

/// Fills `knobs` from the text of horovodrun's YAML config file (`path` is for messages)
/// where the command line left them unset. Throws std::invalid_argument naming the file
/// and the key for YAML it cannot read, an unknown section or key, or a controller other
/// than Gloo.
void read_horovod_config(const std::string& text, const std::string& path, horovod_knobs& knobs);

/// The ranks' environment from the knobs, as horovodrun's set_env_from_args makes it
/// (KEY=VALUE entries). A variable horovodrun sets on every run whatever its flags
/// (HOROVOD_STALL_CHECK_DISABLE=0, ...) is set here only when its knob is given. Throws
/// std::invalid_argument for a value horovodrun refuses, named as the flag is.
std::vector<std::string> horovod_env(const horovod_knobs& knobs);

} // namespace cafhvd

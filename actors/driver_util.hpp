// Helpers shared by the static and the elastic driver.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <caf/all.hpp>

#include "actors/protocol.hpp"

namespace cafhvd {

/// Names a job in node agents' messages: driver host, pid and a time stamp.
std::string make_job_id();

/// Writes all of `s` to `fd`; output to a closed pipe is dropped, never fatal.
void write_all(int fd, const std::string& s);

/// Writes each line followed by '\n', each prefixed with `prefix`, in one write_all.
void write_lines(int fd, const std::vector<std::string>& lines, std::string_view prefix = {});

/// The driver's tag of a rank's output line: "[RANK]<stdout>:" ("[?]" for rank < 0).
std::string output_tag(int rank, int stream);

/// Why connecting to a node agent failed, in words a user can act on.
std::string connect_error(caf::actor_system& sys, const caf::error& e, bool tls);

/// What the driver prints when the job's torch store closed a client for a protocol
/// violation (`problem` names where, the client, its dialect and what it sent).
std::string torch_store_problem_message(const std::string& problem);

/// The name of a node's loopback interface ("lo" if it reported none).
std::string loopback_name(const node_info& info);

} // namespace cafhvd

// Horovod's elastic worker notification, spoken without Python: the registration a
// worker PUTs to /worker_addresses/<host>:<local_rank>, and the HostsUpdatedRequest the
// launcher sends to rank 0's notification service over Horovod's HMAC-framed wire.
//
// Read from horovod 0.28.1: runner/elastic/worker.py (WorkerNotificationManager.init,
// HostsUpdatedRequest, HostUpdateResult), runner/common/util/network.py (Wire,
// BasicService, BasicClient, AckResponse), runner/common/util/secret.py and codec.py.
//  - Registration body: base64(cloudpickle.dumps((addresses, key), HIGHEST_PROTOCOL)),
//    addresses = {interface: [(ipv4, port), ...]} (IPv6 accepted too), key = 32 random
//    bytes. We read it with a pickle interpreter that knows only the opcodes of that
//    value's shape (protocols 3-5: protocol 2 writes bytes as a call, which is refused)
//    and never names, imports or calls anything.
//  - Wire message: HMAC-SHA256(key, body) (32 bytes), the body's length (int32,
//    little-endian), the body (a pickle). One request and one answer per connection:
//    the client connects and writes a message; the service reads exactly that message
//    (no half-close is needed), writes its answer and closes the connection. A service
//    whose key does not match the request's digest closes without answering.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cafhvd {

/// A worker's notification service as it registered itself.
struct worker_registration {
  // interface name -> (IP text, port), in the order the worker sent them
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, uint16_t>>>> addresses;
  std::string key; // HMAC key of the worker's wire; never print it
};

/// "eth0: 10.0.0.5:41234, lo: 127.0.0.1:41234 (key: 32 bytes)"; the key is not shown.
std::string to_string(const worker_registration& r);

/// Bounds on what a registration may hold (a real one is one or two hundred bytes).
struct registration_limits {
  static constexpr size_t max_pickle = 64u << 10; // decoded bytes
  static constexpr size_t max_string = 4096;      // any one str or bytes in the pickle
  static constexpr size_t max_stack = 1024;       // values on the stack at once
  static constexpr size_t max_marks = 32;         // open MARKs
  static constexpr size_t max_memo = 8192;        // memo entries
  static constexpr size_t max_interfaces = 64;
  static constexpr size_t max_addresses = 256; // over all interfaces
  static constexpr size_t max_interface_name = 256;
  static constexpr size_t max_key = 1024; // Horovod's is 32
};

struct decoded_registration {
  std::optional<worker_registration> value; // set when the body was accepted
  std::string error;                        // otherwise: what was expected, what came
};

/// Decodes a PUT /worker_addresses body (base64 text of a pickle). Never throws for bad
/// input; errors name the offending opcode and its offset in the decoded pickle.
decoded_registration decode_worker_registration(std::string_view body) noexcept;
/// The same for the pickle bytes themselves (after base64).
decoded_registration decode_worker_registration_pickle(std::string_view pickle) noexcept;

/// A pickle (protocol 4: what Horovod's Python 3.6-3.7 workers read too) that unpickles
/// into horovod.runner.elastic.worker.HostsUpdatedRequest with .timestamp = `timestamp`
/// and .res = the HostUpdateResult member of value `res` (an IntFlag: no_update = 0,
/// removed = 1, added = 2, mixed = 3), as getattr(HostUpdateResult, '<name>'): the bytes
/// cloudpickle.dumps(..., protocol=4) gives with the real classes on Python 3.11 (which
/// writes mixed as or_(added, removed) instead). Throws std::invalid_argument if res > 3.
std::string encode_hosts_updated(int64_t timestamp, unsigned res);

/// One wire message: HMAC-SHA256(key, body), int32 little-endian length, body. Throws
/// std::length_error for a body over 2^31 - 1 bytes.
std::string frame_message(std::string_view key, std::string_view body);

struct parsed_frame {
  enum class status {
    complete,   // body holds the verified body; used = bytes of the message
    incomplete, // more bytes are needed
    bad_length, // negative or over max_body
    bad_digest, // the digest does not match key and body
  } what = status::incomplete;
  std::string body;
  size_t used = 0;
};

/// Reads the message at the start of `bytes`. The digest is compared (in constant time)
/// before anything else looks at the body; on a mismatch the body is not returned.
parsed_frame parse_framed_message(std::string_view key, std::string_view bytes,
                                  size_t max_body = 64u << 10);

/// Empty if `body` is a pickled horovod.runner.common.util.network.AckResponse (class by
/// reference, no state), else what it is instead. Only names are read, nothing is built.
std::string check_ack_response(std::string_view body) noexcept;

/// One address tried by notify_hosts_updated.
struct notify_attempt {
  enum class outcome {
    acknowledged,      // the worker answered AckResponse
    refused,           // connection refused
    unreachable,       // no route, network down, another connect error
    timed_out,         // the deadline passed (connecting, sending or waiting)
    closed,            // closed before a whole answer (a worker does that for a wrong key)
    digest_mismatch,   // the answer's digest does not match the worker's key
    unexpected_answer, // a verified answer that is not an AckResponse
    bad_address,       // not an IPv4/IPv6 address
    io_error,          // another socket error
  } what = outcome::io_error;
  std::string interface; // as registered
  std::string address;   // "10.0.0.5:41234" or "[fe80::1]:41234"
  std::string detail;    // what went wrong, for the log (empty if acknowledged); never
                         // contains the key
};

const char* to_string(notify_attempt::outcome o);

struct notify_result {
  bool ok = false;                      // some address acknowledged (the last attempt)
  std::vector<notify_attempt> attempts; // every address tried, in order
};

/// "eth0 10.0.0.5:41234: timed out (no answer within 2000 ms (0 bytes came)); lo
/// 127.0.0.1:41234: acknowledged"
std::string to_string(const notify_result& r);

/// Sends HostsUpdatedRequest(timestamp, res) to the worker's addresses in order (every
/// interface's, IPv4 and IPv6) until one acknowledges. Blocking: run it on a helper
/// thread. `deadline` bounds each address's whole attempt (connect, send, answer), so the
/// call takes at most (number of addresses) x deadline. A request may reach a worker
/// whose answer is then lost, and be sent again to its next address; Horovod's worker
/// takes repeated notifications (it ORs the results). res > 3 fails without sending.
notify_result notify_hosts_updated(const worker_registration& worker, int64_t timestamp,
                                   unsigned res, std::chrono::milliseconds deadline);

} // namespace cafhvd

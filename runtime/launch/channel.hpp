// Executor mode's wire: length-prefixed frames with opaque payloads, and a channel that
// carries them over an inherited socket (rank process <-> its worker; the executor's
// owner <-> the job). caf-hvd never looks inside a payload; it checks kinds, order,
// sizes and deadlines. The format is documented in the guide (docs/executors.md, "Executor frames").
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace cafhvd {

enum class frame_kind : uint8_t {
  // both channels
  call = 1,   // run payload: to a rank (id = call number; 0 = the boot call)
  result = 2, // a rank's answer to call `id`
  log = 3,    // a rank's log record (caf_hvd.log), in order per rank
  // the owner's channel only
  failed = 4,    // call `id` failed on `rank`: payload is UTF-8 text naming the cause
  start = 16,    // owner -> job: start the ranks; payload = boot call for every new process
  shutdown = 17, // owner -> job: stop the ranks (EOF of their channel) and end the job
  ranks = 18,    // job -> owner: JSON list of the generation's ranks (host, local/cross)
  end = 19,      // job -> owner: the job ended; id = exit code, payload = cause ("" = ok)
  kill_host = 20, // owner -> elastic job: SIGKILL the ranks on the host named by the payload
};

/// Name of a kind for messages ("call", "result", ...; "kind 42" if unknown).
std::string frame_kind_name(uint8_t kind);

struct frame {
  frame_kind kind = frame_kind::call;
  uint64_t id = 0;          // call number (end: exit code)
  uint32_t rank = 0;        // owner's channel: the rank concerned (all_ranks: every one)
  uint32_t deadline_ms = 0; // calls: how long the rank may take (0 = no limit)
  std::string payload;
};

inline constexpr uint32_t all_ranks = 0xffffffff;
inline constexpr size_t frame_header_size = 24;
inline constexpr uint64_t default_max_frame = uint64_t{256} << 20; // payload bytes

/// The 24-byte header, big-endian: kind u8, three zero bytes, id u64, rank u32,
/// deadline_ms u32, payload length u32.
std::string encode_frame_header(const frame& f);
/// Header and payload in one string.
std::string encode_frame(const frame& f);

/// Splits a byte stream into frames. After the first violation it stays failed.
class frame_decoder {
public:
  explicit frame_decoder(uint64_t max_payload = default_max_frame) : max_(max_payload) {}
  /// Appends the complete frames in `data` to `out`; returns the violation, if any
  /// (unknown kind, non-zero reserved bytes, a payload over the limit).
  std::optional<std::string> feed(const char* data, size_t n, std::vector<frame>& out);
  /// At end of stream: what was cut off, if anything ("" = ended between frames).
  std::string at_eof() const;
  bool failed() const { return failed_; }
  /// Payload bytes the frame being read still needs (0 between frames).
  size_t missing() const { return in_payload_ ? need_ : 0; }

private:
  uint64_t max_;
  std::string header_;
  frame current_;
  size_t need_ = 0; // payload bytes still missing of `current_`
  bool in_payload_ = false;
  bool failed_ = false;
};

/// A frame stream over a connected socket: a reader thread hands every frame to
/// `on_frame`, a writer thread sends what `send` could not write at once, in order. The
/// callbacks run on the reader thread; `on_close` runs once, with "" for a clean end of
/// stream, else the problem (a violation, a frame cut off, a read error). The destructor
/// stops both threads and returns once neither runs a callback any more (so callbacks
/// may use what the owner destroys next; one may destroy the channel itself); the
/// descriptor is closed once neither thread uses it.
class frame_channel {
public:
  using frame_fn = std::function<void(frame&&)>;
  using close_fn = std::function<void(const std::string&)>;

  /// Takes ownership of `fd`.
  frame_channel(int fd, uint64_t max_payload, frame_fn on_frame, close_fn on_close);
  ~frame_channel();
  frame_channel(const frame_channel&) = delete;
  frame_channel& operator=(const frame_channel&) = delete;

  /// Sends `f` in order: with nothing queued, what the socket takes at once is written
  /// here without blocking; the rest is queued for the writer thread. `done` (if any)
  /// runs once the frame is written or dropped (the peer is gone, the channel closed):
  /// here, or on the writer thread.
  void send(frame f, std::function<void()> done = {});
  /// Waits until everything queued is written (or dropped); false on timeout.
  bool flush(std::chrono::milliseconds timeout);
  /// Half-closes the socket once everything queued is written (the peer reads EOF).
  void close_after_writes();
  /// Bytes queued and not yet written.
  size_t pending() const;

private:
  struct shared;
  std::shared_ptr<shared> sh_;
};

/// Blocking helpers for simple peers and tests: writes all of a frame (false on error),
/// reads one frame (nullopt at a clean EOF; throws std::runtime_error on a violation).
bool write_frame(int fd, const frame& f);
std::optional<frame> read_frame(int fd, uint64_t max_payload = default_max_frame);

} // namespace cafhvd

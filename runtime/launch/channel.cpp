// Frames and the frame channel (see channel.hpp).
#include "runtime/launch/channel.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <sys/socket.h>
#include <sys/uio.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/observe/output_writer.hpp"

namespace cafhvd {

namespace {

bool known_kind(uint8_t k) {
  return (k >= 1 && k <= 4) || (k >= 16 && k <= 20);
}

void put_be(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_be(const std::string& in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v = (v << 8) | static_cast<uint8_t>(in[pos + i]);
  return v;
}

} // namespace

std::string frame_kind_name(uint8_t kind) {
  switch (kind) {
    case 1: return "call";
    case 2: return "result";
    case 3: return "log";
    case 4: return "failed";
    case 16: return "start";
    case 17: return "shutdown";
    case 18: return "ranks";
    case 19: return "end";
    case 20: return "kill_host";
    default: return fmt::format("kind {}", kind);
  }
}

std::string encode_frame_header(const frame& f) {
  if (f.payload.size() > 0xffffffffu)
    throw std::length_error("frame payload over 4 GiB");
  std::string out;
  out.reserve(frame_header_size);
  out.push_back(static_cast<char>(f.kind));
  out.append(3, '\0');
  put_be(out, f.id, 8);
  put_be(out, f.rank, 4);
  put_be(out, f.deadline_ms, 4);
  put_be(out, f.payload.size(), 4);
  return out;
}

std::string encode_frame(const frame& f) {
  auto out = encode_frame_header(f);
  out += f.payload;
  return out;
}

std::optional<std::string> frame_decoder::feed(const char* data, size_t n,
                                               std::vector<frame>& out) {
  if (failed_)
    return std::string{"the stream already broke the frame format"};
  while (n > 0) {
    if (!in_payload_) {
      auto take = std::min(n, frame_header_size - header_.size());
      header_.append(data, take);
      data += take;
      n -= take;
      if (header_.size() < frame_header_size)
        break;
      auto kind = static_cast<uint8_t>(header_[0]);
      if (!known_kind(kind)) {
        failed_ = true;
        return fmt::format("unknown frame kind {} (first bytes {:02x} {:02x} {:02x} {:02x})",
                           kind, static_cast<uint8_t>(header_[0]),
                           static_cast<uint8_t>(header_[1]), static_cast<uint8_t>(header_[2]),
                           static_cast<uint8_t>(header_[3]));
      }
      if (header_[1] != 0 || header_[2] != 0 || header_[3] != 0) {
        failed_ = true;
        return fmt::format("{} frame with non-zero reserved bytes", frame_kind_name(kind));
      }
      current_ = frame{};
      current_.kind = static_cast<frame_kind>(kind);
      current_.id = get_be(header_, 4, 8);
      current_.rank = static_cast<uint32_t>(get_be(header_, 12, 4));
      current_.deadline_ms = static_cast<uint32_t>(get_be(header_, 16, 4));
      auto len = get_be(header_, 20, 4);
      header_.clear();
      if (len > max_) {
        failed_ = true;
        return fmt::format("{} frame of {} bytes is over the limit of {} bytes",
                           frame_kind_name(kind), len, max_);
      }
      current_.payload.reserve(len);
      need_ = len;
      in_payload_ = true;
    }
    auto take = std::min(n, need_);
    current_.payload.append(data, take);
    data += take;
    n -= take;
    need_ -= take;
    if (need_ == 0) {
      in_payload_ = false;
      out.push_back(std::move(current_));
      current_ = frame{};
    }
  }
  return std::nullopt;
}

std::string frame_decoder::at_eof() const {
  if (in_payload_)
    return fmt::format("the stream ended inside a {} frame ({} of {} payload bytes)",
                       frame_kind_name(static_cast<uint8_t>(current_.kind)),
                       current_.payload.size(), current_.payload.size() + need_);
  if (!header_.empty())
    return fmt::format("the stream ended inside a frame header ({} of {} bytes)", header_.size(),
                       frame_header_size);
  return {};
}

// -- the channel ------------------------------------------------------------------------

struct frame_channel::shared {
  int fd = -1;
  mutable std::mutex m;
  std::condition_variable cv;
  struct item {
    std::string header; // the payload is sent from the frame itself, not copied
    std::string payload;
    std::function<void()> done;
    size_t skip = 0; // bytes of header + payload already written by `send` itself
  };
  std::deque<item> queue;
  size_t pending = 0;
  bool writing = false;
  std::condition_variable idle;
  bool stop = false;
  bool half_close = false;
  // The reader and writer threads still running (the destructor waits for them, so no
  // callback runs once it returned), and who they are (a callback may destroy the
  // channel: it does not wait for its own thread).
  int threads = 2;
  std::thread::id reader, writer;
  std::condition_variable ended;
  void thread_ended() {
    std::lock_guard guard{m};
    --threads;
    ended.notify_all();
  }
  ~shared() {
    if (fd >= 0)
      ::close(fd);
  }
};

namespace {

bool send_fully(int fd, std::string_view bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    auto n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK)
      return write_fully(fd, bytes.substr(off));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

// What of `header` + `payload` the socket takes now, without waiting: 0 when it takes
// nothing or is not a socket (the writer thread then sends it and sees any error).
size_t send_now(int fd, const std::string& header, const std::string& payload) {
  iovec iov[2] = {{const_cast<char*>(header.data()), header.size()},
                  {const_cast<char*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  for (;;) {
    auto n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0)
      return static_cast<size_t>(n);
    if (errno != EINTR)
      return 0;
  }
}

} // namespace

frame_channel::frame_channel(int fd, uint64_t max_payload, frame_fn on_frame, close_fn on_close)
    : sh_(std::make_shared<shared>()) {
  sh_->fd = fd;
  std::lock_guard guard{sh_->m}; // the threads' ids are known before either can end
  std::thread reader{[sh = sh_, max_payload, on_frame = std::move(on_frame),
                      on_close = std::move(on_close)]() mutable {
    frame_decoder dec{max_payload};
    std::vector<char> buf(1 << 20);
    std::string problem;
    for (;;) {
      auto n = ::read(sh->fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && errno != ECONNRESET) { // a reset is the peer's end, as EOF is
        problem = sh->stop ? std::string{} : fmt::format("read failed: {}", std::strerror(errno));
        break;
      }
      if (n <= 0) {
        problem = dec.at_eof();
        break;
      }
      std::vector<frame> frames;
      auto bad = dec.feed(buf.data(), static_cast<size_t>(n), frames);
      for (auto& f : frames)
        on_frame(std::move(f));
      if (bad) {
        problem = *bad;
        break;
      }
    }
    on_close(problem);
    on_frame = nullptr; // what the callbacks hold goes before the destructor returns
    on_close = nullptr;
    sh->thread_ended();
  }};
  std::thread writer{[sh = sh_] {
    struct on_return {
      shared& sh;
      ~on_return() { sh.thread_ended(); }
    } ended{*sh};
    std::unique_lock guard{sh->m};
    auto drop_all = [&] {
      auto rest = std::move(sh->queue);
      sh->queue.clear();
      sh->pending = 0;
      guard.unlock();
      for (auto& x : rest)
        if (x.done)
          x.done();
      guard.lock();
      sh->idle.notify_all();
    };
    for (;;) {
      sh->cv.wait(guard, [&] { return sh->stop || sh->half_close || !sh->queue.empty(); });
      if (sh->stop)
        return drop_all();
      if (sh->queue.empty()) { // half_close with nothing left to write
        ::shutdown(sh->fd, SHUT_WR);
        sh->idle.notify_all();
        return;
      }
      auto x = std::move(sh->queue.front());
      sh->queue.pop_front();
      sh->writing = true;
      guard.unlock();
      std::string_view head{x.header}, body{x.payload};
      if (x.skip < head.size()) {
        head.remove_prefix(x.skip);
      } else {
        body.remove_prefix(x.skip - head.size());
        head = {};
      }
      bool ok = send_fully(sh->fd, head) && send_fully(sh->fd, body);
      if (x.done)
        x.done();
      guard.lock();
      sh->writing = false;
      sh->pending -= x.header.size() + x.payload.size() - x.skip;
      if (!ok) { // the peer is gone: the reader sees it; drop the rest
        sh->stop = true;
        return drop_all();
      }
      if (sh->queue.empty())
        sh->idle.notify_all();
    }
  }};
  sh_->reader = reader.get_id();
  sh_->writer = writer.get_id();
  reader.detach();
  writer.detach();
}

frame_channel::~frame_channel() {
  std::unique_lock guard{sh_->m};
  sh_->stop = true;
  sh_->cv.notify_all();
  ::shutdown(sh_->fd, SHUT_RDWR); // wakes both threads; the descriptor closes with `shared`
  // Both threads leave at once now (the reader reads EOF, the writer's send fails or it
  // wakes to `stop`) unless a callback blocks; their callbacks capture what the owner
  // is about to destroy, so none may run after this returns.
  auto me = std::this_thread::get_id();
  int own = me == sh_->reader || me == sh_->writer ? 1 : 0;
  if (!sh_->ended.wait_for(guard, std::chrono::seconds(10), [&] { return sh_->threads == own; }))
    std::fprintf(stderr, "caf-hvd: warning: a rank channel's callbacks did not return within "
                         "10 s of its close; they may still run\n");
}

void frame_channel::send(frame f, std::function<void()> done) {
  auto header = encode_frame_header(f);
  if (f.payload.size() < 65536) { // small frames: one write
    header += f.payload;
    f.payload.clear();
  }
  bool queued = false;
  {
    std::lock_guard guard{sh_->m};
    if (!sh_->stop && !sh_->half_close) {
      // Nothing ahead of it: the caller writes what the socket takes at once, so a
      // frame that fits costs no wake-up of the writer thread. The lock keeps the order.
      size_t total = header.size() + f.payload.size();
      size_t sent = sh_->queue.empty() && !sh_->writing ? send_now(sh_->fd, header, f.payload) : 0;
      if (sent < total) {
        sh_->pending += total - sent;
        sh_->queue.push_back({std::move(header), std::move(f.payload), std::move(done), sent});
        done = nullptr;
        queued = true;
      }
    }
  }
  if (done)
    done();
  if (queued)
    sh_->cv.notify_all();
}

bool frame_channel::flush(std::chrono::milliseconds timeout) {
  std::unique_lock guard{sh_->m};
  return sh_->idle.wait_for(guard, timeout,
                            [&] { return sh_->queue.empty() && !sh_->writing; });
}

void frame_channel::close_after_writes() {
  {
    std::lock_guard guard{sh_->m};
    sh_->half_close = true;
  }
  sh_->cv.notify_all();
}

size_t frame_channel::pending() const {
  std::lock_guard guard{sh_->m};
  return sh_->pending;
}

bool write_frame(int fd, const frame& f) {
  return send_fully(fd, encode_frame(f));
}

std::optional<frame> read_frame(int fd, uint64_t max_payload) {
  frame_decoder dec{max_payload};
  std::vector<frame> out;
  char buf[frame_header_size];
  size_t have = 0;
  // Header first, byte-exact, so nothing of the next frame is consumed.
  while (have < frame_header_size) {
    auto n = ::read(fd, buf + have, frame_header_size - have);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw std::runtime_error(fmt::format("read failed: {}", std::strerror(errno)));
    if (n == 0) {
      if (have == 0)
        return std::nullopt;
      throw std::runtime_error(fmt::format(
          "the stream ended inside a frame header ({} of {} bytes)", have, frame_header_size));
    }
    have += static_cast<size_t>(n);
  }
  if (auto bad = dec.feed(buf, have, out))
    throw std::runtime_error(*bad);
  if (!out.empty())
    return std::move(out.front());
  std::vector<char> body(1 << 20);
  for (;;) {
    // exactly what the frame still needs: the next frame stays in the socket
    auto n = ::read(fd, body.data(), std::min(body.size(), dec.missing()));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      throw std::runtime_error(fmt::format("read failed: {}", std::strerror(errno)));
    if (n == 0)
      throw std::runtime_error(dec.at_eof());
    if (auto bad = dec.feed(body.data(), static_cast<size_t>(n), out))
      throw std::runtime_error(*bad);
    if (!out.empty())
      return std::move(out.front());
  }
}

} // namespace cafhvd

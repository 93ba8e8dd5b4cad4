// Executor frames: the codec byte for byte, its limits, and the channel over a real
// socketpair (a peer that closes mid-frame, garbage, an oversized frame).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "runtime/launch/channel.hpp"

using namespace cafhvd;

namespace {

frame make(frame_kind k, uint64_t id, uint32_t rank, std::string payload, uint32_t dl = 0) {
  frame f;
  f.kind = k;
  f.id = id;
  f.rank = rank;
  f.deadline_ms = dl;
  f.payload = std::move(payload);
  return f;
}

// What a channel delivered, for a test to wait on.
struct inbox {
  std::mutex m;
  std::condition_variable cv;
  std::vector<frame> frames;
  std::optional<std::string> closed;
  frame_channel::frame_fn on_frame() {
    return [this](frame&& f) {
      std::lock_guard g{m};
      frames.push_back(std::move(f));
      cv.notify_all();
    };
  }
  frame_channel::close_fn on_close() {
    return [this](const std::string& why) {
      std::lock_guard g{m};
      closed = why;
      cv.notify_all();
    };
  }
  std::string wait_closed() {
    std::unique_lock g{m};
    REQUIRE(cv.wait_for(g, std::chrono::seconds(10), [&] { return closed.has_value(); }));
    return *closed;
  }
};

} // namespace

TEST_CASE("a frame's header is 24 big-endian bytes as the guide documents") {
  auto bytes = encode_frame(make(frame_kind::result, 0x0102030405060708ull, 0x0a0b0c0d, "xy", 7));
  REQUIRE(bytes.size() == frame_header_size + 2);
  const unsigned char want[] = {2,    0,    0,    0,    1, 2, 3, 4, 5, 6, 7, 8,
                                0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 7, 0, 0, 0, 2};
  for (size_t i = 0; i < sizeof(want); ++i)
    CHECK(static_cast<unsigned char>(bytes[i]) == want[i]);
  CHECK(bytes.substr(24) == "xy");
}

TEST_CASE("frames decode the same however the stream is cut") {
  std::string stream;
  std::vector<frame> sent{make(frame_kind::call, 1, all_ranks, std::string(1000, 'a'), 5),
                          make(frame_kind::log, 0, 3, ""),
                          make(frame_kind::result, 2, 1, std::string("\0\1\2", 3))};
  for (auto& f : sent)
    stream += encode_frame(f);
  for (size_t cut = 1; cut <= 97; cut += 8) {
    frame_decoder dec;
    std::vector<frame> got;
    for (size_t off = 0; off < stream.size(); off += cut)
      REQUIRE_FALSE(dec.feed(stream.data() + off, std::min(cut, stream.size() - off), got));
    REQUIRE(got.size() == sent.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      CHECK(got[i].kind == sent[i].kind);
      CHECK(got[i].id == sent[i].id);
      CHECK(got[i].rank == sent[i].rank);
      CHECK(got[i].deadline_ms == sent[i].deadline_ms);
      CHECK(got[i].payload == sent[i].payload);
    }
    CHECK(dec.at_eof().empty());
  }
}

TEST_CASE("an oversized frame is refused from its header, naming both sizes") {
  frame_decoder dec{1000};
  std::vector<frame> got;
  auto head = encode_frame_header(make(frame_kind::result, 4, 0, std::string(1001, 'x')));
  auto bad = dec.feed(head.data(), head.size(), got);
  REQUIRE(bad);
  CHECK(*bad == "result frame of 1001 bytes is over the limit of 1000 bytes");
  CHECK(got.empty());
  CHECK(dec.failed());
  // a frame exactly at the limit passes
  frame_decoder ok{1000};
  auto fine = encode_frame(make(frame_kind::result, 4, 0, std::string(1000, 'x')));
  CHECK_FALSE(ok.feed(fine.data(), fine.size(), got));
  CHECK(got.size() == 1);
}

TEST_CASE("garbage is refused: unknown kinds and non-zero reserved bytes") {
  std::vector<frame> got;
  {
    frame_decoder dec;
    std::string text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    auto bad = dec.feed(text.data(), text.size(), got);
    REQUIRE(bad);
    CHECK(bad->find("unknown frame kind 71") == 0);
  }
  {
    frame_decoder dec;
    auto head = encode_frame_header(make(frame_kind::call, 1, 0, ""));
    head[2] = 1;
    auto bad = dec.feed(head.data(), head.size(), got);
    REQUIRE(bad);
    CHECK(*bad == "call frame with non-zero reserved bytes");
  }
  CHECK(got.empty());
}

TEST_CASE("a truncated frame is named at the end of the stream") {
  std::vector<frame> got;
  auto bytes = encode_frame(make(frame_kind::result, 9, 0, std::string(100, 'r')));
  frame_decoder dec;
  REQUIRE_FALSE(dec.feed(bytes.data(), 60, got));
  CHECK(got.empty());
  CHECK(dec.at_eof() == "the stream ended inside a result frame (36 of 100 payload bytes)");
  frame_decoder head_only;
  REQUIRE_FALSE(head_only.feed(bytes.data(), 10, got));
  CHECK(head_only.at_eof() == "the stream ended inside a frame header (10 of 24 bytes)");
}

TEST_CASE("a channel carries frames both ways and reports a clean end") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  inbox in;
  {
    frame_channel ch{sv[0], default_max_frame, in.on_frame(), in.on_close()};
    std::string big(8 << 20, '\0');
    for (size_t i = 0; i < big.size(); ++i)
      big[i] = static_cast<char>(i * 131);
    std::atomic<bool> written{false};
    ch.send(make(frame_kind::call, 1, 0, big), [&] { written = true; });
    auto got = read_frame(sv[1]);
    REQUIRE(got);
    CHECK(got->payload == big);
    REQUIRE(ch.flush(std::chrono::seconds(5)));
    CHECK(written);
    REQUIRE(write_frame(sv[1], make(frame_kind::result, 1, 0, "answer")));
    REQUIRE(write_frame(sv[1], make(frame_kind::log, 0, 0, "line")));
    ::close(sv[1]);
    CHECK(in.wait_closed() == "");
    REQUIRE(in.frames.size() == 2);
    CHECK(in.frames[0].payload == "answer");
    CHECK(in.frames[1].kind == frame_kind::log);
  }
}

TEST_CASE("a peer that closes mid-frame, or sends garbage or too much, is reported") {
  struct scenario {
    std::string bytes;
    uint64_t limit;
    std::string expected;
  };
  auto partial = encode_frame(make(frame_kind::result, 3, 0, std::string(500, 'p'))).substr(0, 100);
  std::vector<scenario> cases{
      {partial, default_max_frame, "the stream ended inside a result frame (76 of 500 payload bytes)"},
      {std::string(30, '\xff'), default_max_frame, "unknown frame kind 255"},
      {encode_frame(make(frame_kind::result, 3, 0, std::string(2048, 'p'))), 1024,
       "result frame of 2048 bytes is over the limit of 1024 bytes"}};
  for (auto& c : cases) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    inbox in;
    frame_channel ch{sv[0], c.limit, in.on_frame(), in.on_close()};
    REQUIRE(::write(sv[1], c.bytes.data(), c.bytes.size()) == static_cast<ssize_t>(c.bytes.size()));
    ::shutdown(sv[1], SHUT_WR);
    auto why = in.wait_closed();
    CHECK(why.find(c.expected) == 0);
    CHECK(in.frames.empty());
    ::close(sv[1]);
  }
}

TEST_CASE("close_after_writes delivers what was queued, then EOF; a gone peer drops the rest") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  inbox in;
  frame_channel ch{sv[0], default_max_frame, in.on_frame(), in.on_close()};
  for (uint64_t i = 1; i <= 3; ++i)
    ch.send(make(frame_kind::call, i, 0, std::to_string(i)));
  ch.close_after_writes();
  ch.send(make(frame_kind::call, 4, 0, "late")); // refused: the channel is closing
  for (uint64_t i = 1; i <= 3; ++i) {
    auto f = read_frame(sv[1]);
    REQUIRE(f);
    CHECK(f->id == i);
  }
  CHECK_FALSE(read_frame(sv[1])); // EOF, nothing of call 4
  ::close(sv[1]);
  CHECK(in.wait_closed() == "");
}

TEST_CASE("frames the socket cannot take at once are finished by the writer, in order") {
  // `send` writes what the socket takes without waiting and queues the rest: a frame cut
  // there (inside its header, inside its payload) must go on from that byte, and frames
  // sent after it must wait behind it.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int small = 4096;
  REQUIRE(::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
  REQUIRE(::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
  inbox in;
  frame_channel ch{sv[0], default_max_frame, in.on_frame(), in.on_close()};
  auto payload_of = [](uint64_t id) {
    static const size_t sizes[] = {0, 1, 17, 1000, 4095, 65535, 65536, 200000};
    std::string p(sizes[id % 8], '\0');
    for (size_t i = 0; i < p.size(); ++i)
      p[i] = static_cast<char>(i * 7 + id);
    return p;
  };
  std::mutex m;
  std::vector<uint64_t> done;
  constexpr uint64_t n = 48;
  for (uint64_t id = 1; id <= n; ++id)
    ch.send(make(frame_kind::call, id, 0, payload_of(id)), [&, id] {
      std::lock_guard g{m};
      done.push_back(id);
    });
  CHECK(ch.pending() > 0); // nobody reads yet: most of it waits
  for (uint64_t id = 1; id <= n; ++id) {
    auto f = read_frame(sv[1]);
    REQUIRE(f);
    CHECK(f->id == id);
    CHECK(f->payload == payload_of(id));
  }
  REQUIRE(ch.flush(std::chrono::seconds(5)));
  CHECK(ch.pending() == 0);
  std::vector<uint64_t> expected;
  for (uint64_t id = 1; id <= n; ++id)
    expected.push_back(id);
  std::lock_guard g{m};
  CHECK(done == expected);
  ::close(sv[1]);
}

TEST_CASE("no callback of a channel runs once its destructor returned; a callback may "
          "destroy its own channel") {
  // A slow consumer is inside on_frame when the owner destroys the channel: the
  // destructor waits for it (its callbacks capture what the owner destroys next), and
  // neither on_close nor a dropped frame's `done` runs afterwards.
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  int small = 4096;
  REQUIRE(::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
  std::atomic<bool> entered{false}, returned{false}, destroyed{false};
  std::atomic<int> after{0};
  auto ch = std::make_unique<frame_channel>(
      sv[0], default_max_frame,
      [&](frame&&) {
        after += destroyed ? 1 : 0;
        entered = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        returned = true;
      },
      [&](const std::string&) { after += destroyed ? 1 : 0; });
  ch->send(make(frame_kind::call, 1, 0, std::string(1 << 20, 'q')), [&] {
    after += destroyed ? 1 : 0; // dropped when the channel goes: before its destructor returns
  });
  REQUIRE(write_frame(sv[1], make(frame_kind::result, 1, 0, "x")));
  for (int i = 0; i < 500 && !entered; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(entered);
  ch.reset();
  destroyed = true;
  CHECK(returned); // the destructor waited for the callback in progress
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(after == 0);
  ::close(sv[1]);

  // on_close destroys the channel it belongs to (its owner lets go on the end of stream)
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  std::mutex m;
  std::condition_variable cv;
  std::unique_ptr<frame_channel> self_owned;
  bool gone = false;
  {
    std::lock_guard g{m};
    self_owned = std::make_unique<frame_channel>(
        sv[0], default_max_frame, [](frame&&) {}, [&](const std::string&) {
          std::unique_ptr<frame_channel> mine;
          {
            std::lock_guard g2{m};
            mine = std::move(self_owned);
          }
          mine.reset(); // on its own reader thread: must not wait for itself
          std::lock_guard g2{m};
          gone = true;
          cv.notify_all();
        });
  }
  ::close(sv[1]);
  std::unique_lock g{m};
  CHECK(cv.wait_for(g, std::chrono::seconds(5), [&] { return gone; }));
}

// torch_store_server on Boost.Asio: one thread, asynchronous sessions, bounded sizes.
// Wire format (torch 1.13 TCPStore): a query type byte, then arguments; strings and
// byte vectors are a uint64 length plus bytes, integers are native int64/uint64.
#include "runtime/torch_store.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <fmt/format.h>

namespace cafhvd {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

enum query : uint8_t {
  set_q,
  compare_set_q,
  get_q,
  add_q,
  check_q,
  wait_q,
  num_keys_q,
  watch_q,
  delete_q
};
constexpr uint64_t max_item = 64u << 20;    // one key or value
constexpr size_t max_buffered = 128u << 20; // one connection's unparsed input

// Reads from a byte buffer; every read reports whether enough bytes were there.
struct reader {
  const std::vector<char>& buf;
  size_t pos = 0;
  bool ok = true;
  template <class T> T value() {
    T v{};
    if (!ok || buf.size() - pos < sizeof(T)) {
      ok = false;
      return v;
    }
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string bytes() {
    auto n = value<uint64_t>();
    if (!ok || n > max_item || buf.size() - pos < n) {
      ok = ok && n <= max_item;
      if (n > max_item)
        throw std::length_error("item too large");
      ok = false;
      return {};
    }
    std::string s(buf.data() + pos, n);
    pos += n;
    return s;
  }
};

template <class T> void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

} // namespace

struct torch_store_server::impl {
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::map<std::string, std::string> data;
  size_t connections = 0;
  struct session;
  // Sessions blocked in WAIT; held strongly, since nothing else refers to them then.
  std::vector<std::shared_ptr<session>> waiting;

  void accept();
  void wake();
};

struct torch_store_server::impl::session : std::enable_shared_from_this<session> {
  impl& srv;
  tcp::socket sock;
  std::vector<char> in;
  char chunk[65536];
  bool writing = false;
  std::string out;

  session(impl& s, tcp::socket so) : srv(s), sock(std::move(so)) { ++srv.connections; }
  ~session() { --srv.connections; }

  void read() {
    sock.async_read_some(net::buffer(chunk), [self = shared_from_this()](auto ec, size_t n) {
      if (ec)
        return; // peer gone: the session ends with its last reference
      self->in.insert(self->in.end(), self->chunk, self->chunk + n);
      if (self->in.size() > max_buffered)
        return self->close();
      self->serve();
    });
  }

  // Answers every complete query in the buffer; stops at an incomplete one or a WAIT
  // whose keys are missing (resumed by wake()).
  void serve() {
    for (;;) {
      if (in.empty())
        return read();
      reader r{in};
      std::string reply;
      try {
        auto q = r.value<uint8_t>();
        switch (q) {
        case set_q: {
          auto k = r.bytes();
          auto v = r.bytes();
          if (!r.ok)
            return read();
          srv.data[k] = std::move(v);
          consume(r.pos);
          srv.wake();
          continue;
        }
        case compare_set_q: {
          auto k = r.bytes();
          auto expected = r.bytes();
          auto desired = r.bytes();
          if (!r.ok)
            return read();
          auto it = srv.data.find(k);
          std::string current;
          if (it == srv.data.end()) {
            if (expected.empty()) {
              srv.data[k] = desired;
              current = desired;
            } else {
              current = expected;
            }
          } else if (it->second == expected) {
            it->second = desired;
            current = desired;
          } else {
            current = it->second;
          }
          put<uint64_t>(reply, current.size());
          reply += current;
          break;
        }
        case get_q: {
          auto k = r.bytes();
          if (!r.ok)
            return read();
          auto it = srv.data.find(k);
          auto v = it == srv.data.end() ? std::string{} : it->second;
          put<uint64_t>(reply, v.size());
          reply += v;
          break;
        }
        case add_q: {
          auto k = r.bytes();
          auto n = r.value<int64_t>();
          if (!r.ok)
            return read();
          auto& slot = srv.data[k];
          int64_t v = (slot.empty() ? 0 : std::stoll(slot)) + n;
          slot = std::to_string(v);
          put<int64_t>(reply, v);
          consume(r.pos);
          send(reply);
          srv.wake();
          continue;
        }
        case check_q:
        case wait_q: {
          auto n = r.value<uint64_t>();
          if (n > 65536)
            return close();
          bool all = true;
          for (uint64_t i = 0; i < n && r.ok; ++i) {
            auto k = r.bytes();
            all = all && srv.data.count(k);
          }
          if (!r.ok)
            return read();
          if (q == wait_q && !all) {
            srv.waiting.push_back(shared_from_this());
            return; // serve() runs again when a key is set
          }
          put<uint8_t>(reply, q == check_q ? (all ? 0 : 1) : 0);
          break;
        }
        case num_keys_q:
          put<int64_t>(reply, static_cast<int64_t>(srv.data.size()));
          break;
        case delete_q: {
          auto k = r.bytes();
          if (!r.ok)
            return read();
          put<int64_t>(reply, static_cast<int64_t>(srv.data.erase(k)));
          break;
        }
        default: // watch_q (callbacks) and anything unknown are not served
          if (std::getenv("CAF_HVD_DEBUG_STORE"))
            std::fprintf(stderr, "torch store: query %d not served\n", q);
          return close();
        }
      } catch (const std::exception& e) {
        if (std::getenv("CAF_HVD_DEBUG_STORE"))
          std::fprintf(stderr, "torch store: %s\n", e.what());
        return close();
      }
      consume(r.pos);
      send(reply);
    }
  }

  void consume(size_t n) { in.erase(in.begin(), in.begin() + static_cast<long>(n)); }

  void send(const std::string& reply) {
    out += reply;
    flush();
  }

  void flush() {
    if (writing || out.empty())
      return;
    writing = true;
    auto data = std::make_shared<std::string>(std::move(out));
    out.clear();
    net::async_write(sock, net::buffer(*data), [self = shared_from_this(), data](auto ec, size_t) {
      self->writing = false;
      if (ec)
        return self->close();
      self->flush();
    });
  }

  void close() {
    boost::system::error_code ignored;
    sock.close(ignored);
  }
};

void torch_store_server::impl::wake() {
  auto w = std::move(waiting);
  waiting.clear();
  for (auto& s : w)
    s->serve();
}

void torch_store_server::impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted)
      return;
    if (!ec && connections < 4096) {
      sock.set_option(tcp::no_delay(true), ec);
      std::make_shared<session>(*this, std::move(sock))->read();
    }
    accept();
  });
}

torch_store_server::torch_store_server(const std::string& bind, uint16_t port)
    : impl_(std::make_unique<impl>()) {
  boost::system::error_code ec;
  auto addr = net::ip::make_address(bind, ec);
  tcp::endpoint ep{addr, port};
  if (!ec)
    impl_->acceptor.open(ep.protocol(), ec);
  if (!ec)
    impl_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec)
    impl_->acceptor.bind(ep, ec);
  if (!ec)
    impl_->acceptor.listen(4096, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("torch store: cannot listen on {}:{}: {}", bind, port, ec.message()));
  impl_->accept();
  impl_->thread = std::thread{[this] { impl_->io.run(); }};
}

torch_store_server::~torch_store_server() {
  net::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
  });
  impl_->thread.join();
}

uint16_t torch_store_server::port() const {
  return impl_->acceptor.local_endpoint().port();
}

} // namespace cafhvd

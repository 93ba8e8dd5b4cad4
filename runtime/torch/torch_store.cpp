// torch_store_server on Boost.Asio: one thread, one torch_store_core, asynchronous
// sessions that always keep reading (a client waiting on a key may cancel the wait).
#include "runtime/torch/torch_store.hpp"
#include "runtime/network/listen.hpp"

#include <cstdio>
#include <future>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>

#include <boost/asio.hpp>
#include <fmt/format.h>

namespace cafhvd {

namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
constexpr size_t max_connections = 4096;
constexpr size_t max_reported = 16; // problem lines per server; the rest are counted
} // namespace

struct torch_store_server::impl {
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  std::thread thread;
  torch_store_core core;
  problem_handler on_problem;
  std::shared_ptr<address_allowlist> allowlist;
  problem_handler on_refused;
  size_t reported = 0;
  uint64_t next_id = 1;
  size_t per_client_limit;
  bool loopback_exempt;
  std::unordered_map<std::string, size_t> conns_of; // per client address (not loopback)
  struct session;
  std::unordered_map<uint64_t, std::weak_ptr<session>> sessions;

  explicit impl(torch_store_limits limits)
      : core(limits), per_client_limit(limits.max_connections_per_client),
        loopback_exempt(limits.loopback_exempt) {}
  void accept();
  void deliver(torch_store_core::result& r);
  void report(const std::string& line) {
    std::fprintf(stderr, "caf-hvd torch store: %s\n", line.c_str());
    if (on_problem && reported++ < max_reported)
      on_problem(line);
  }
};

struct torch_store_server::impl::session : std::enable_shared_from_this<session> {
  impl& srv;
  tcp::socket sock;
  uint64_t id;
  std::string peer;
  char chunk[65536];
  bool writing = false;
  bool closed = false;
  std::string out;
  std::string counted; // the client address this session counts against, if any

  session(impl& s, tcp::socket so, uint64_t i, std::string client)
      : srv(s), sock(std::move(so)), id(i), counted(std::move(client)) {
    boost::system::error_code ec;
    auto ep = sock.remote_endpoint(ec);
    peer = ec ? std::string{"?"} : fmt::format("{}:{}", ep.address().to_string(), ep.port());
    srv.core.connect(id);
    if (!counted.empty())
      ++srv.conns_of[counted];
  }
  ~session() {
    srv.core.disconnect(id);
    srv.sessions.erase(id);
    if (!counted.empty() && --srv.conns_of[counted] == 0)
      srv.conns_of.erase(counted);
  }

  void read() {
    sock.async_read_some(net::buffer(chunk), [self = shared_from_this()](auto ec, size_t n) {
      if (ec || self->closed)
        return self->close(); // peer gone: the session ends with its last reference
      auto dialect_before = self->srv.core.dialect(self->id);
      auto r = self->srv.core.feed(self->id, std::string_view{self->chunk, n});
      if (r.close) {
        auto d = self->srv.core.dialect(self->id);
        if (d == torch_dialect::unknown)
          d = dialect_before;
        self->srv.report(fmt::format("closed the connection from {} ({} protocol): {}", self->peer,
                                     to_string(d), r.problem));
      }
      self->srv.deliver(r);
      if (r.close)
        return self->close();
      self->read();
    });
  }

  void send(std::string bytes) {
    if (closed)
      return;
    out += bytes;
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
    if (closed)
      return;
    closed = true;
    srv.core.disconnect(id);
    boost::system::error_code ignored;
    sock.shutdown(tcp::socket::shutdown_both, ignored);
    sock.close(ignored);
  }
};

void torch_store_server::impl::deliver(torch_store_core::result& r) {
  for (auto& s : r.sends) {
    auto it = sessions.find(s.conn);
    if (it == sessions.end())
      continue;
    if (auto sp = it->second.lock())
      sp->send(std::move(s.bytes));
  }
}

void torch_store_server::impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted)
      return;
    if (!ec && allowlist) {
      boost::system::error_code pe;
      auto from = sock.remote_endpoint(pe).address().to_string();
      std::string refusal;
      if (!pe)
        refusal = allowlist->refusal(from, owner_of_peer(sock.native_handle()));
      if (pe || !refusal.empty()) {
        if (!pe && on_refused && allowlist->first_refusal("torch store", from + refusal))
          on_refused(
              fmt::format("the torch store refused a connection from {}: {}", from, refusal));
        boost::system::error_code ignored;
        sock.close(ignored);
        accept();
        return;
      }
    }
    std::string client;
    if (!ec) {
      boost::system::error_code pe;
      auto from = sock.remote_endpoint(pe).address();
      if (!pe && !(loopback_exempt && from.is_loopback())) // the driver's own host
        client = from.to_string();
    }
    auto open = conns_of.find(client);
    if (!ec && !client.empty() && open != conns_of.end() && open->second >= per_client_limit) {
      if (allowlist && on_refused && allowlist->first_refusal("torch store limit", client))
        on_refused(fmt::format("the torch store refused a connection from {}: it already has "
                               "{} connections open (the per-client limit)",
                               client, per_client_limit));
      boost::system::error_code ignored;
      sock.close(ignored);
    } else if (!ec && sessions.size() < max_connections) {
      sock.set_option(tcp::no_delay(true), ec);
      auto id = next_id++;
      auto s = std::make_shared<session>(*this, std::move(sock), id, client);
      sessions.emplace(id, s);
      s->read();
    } else if (!ec) {
      report(fmt::format("refused a connection: {} connections are open", max_connections));
    }
    if (ec && ec != net::error::operation_aborted) {
      // Out of descriptors and similar: retry a little later rather than spin.
      auto t = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(50));
      t->async_wait([this, t](auto) { accept(); });
      return;
    }
    accept();
  });
}

torch_store_server::torch_store_server(const std::string& bind, uint16_t port,
                                       problem_handler on_problem, torch_store_limits limits,
                                       std::shared_ptr<address_allowlist> allowlist,
                                       problem_handler on_refused)
    : impl_(std::make_unique<impl>(limits)) {
  impl_->on_problem = std::move(on_problem);
  impl_->allowlist = std::move(allowlist);
  impl_->on_refused = std::move(on_refused);
  boost::system::error_code ec;
  auto addr = net::ip::make_address(bind, ec);
  if (!ec)
    ec = listen_on(impl_->acceptor, addr, port, 4096);
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
    for (auto& [id, w] : impl_->sessions)
      if (auto s = w.lock()) {
        s->closed = true;
        s->sock.close(ignored);
      }
    impl_->io.stop();
  });
  impl_->thread.join();
  // Run the aborted completions now, so the sessions they hold end while the store
  // they refer to still exists.
  impl_->io.restart();
  impl_->io.poll();
}

uint16_t torch_store_server::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void torch_store_server::clear() {
  std::promise<void> done;
  auto f = done.get_future();
  net::post(impl_->io, [this, &done] {
    impl_->core.clear();
    done.set_value();
  });
  f.wait();
}

} // namespace cafhvd

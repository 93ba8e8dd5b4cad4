// The live view: Boost.Beast on one thread; every answer is drawn from a copy of the
// events taken under a lock, so the job's thread only ever appends.
#include "runtime/observe/dashboard.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <list>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "runtime/observe/timeline.hpp"
#include "runtime/network/listen.hpp"
#include "runtime/observe/text.hpp"

namespace cafhvd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::pair<std::string, uint16_t> parse_dashboard_address(const std::string& spec) {
  std::string addr = "127.0.0.1", port_text = spec;
  if (!spec.empty() && spec.front() == '[') {
    auto close = spec.find("]:");
    if (close == std::string::npos)
      throw std::invalid_argument(
          fmt::format("--dashboard {}: write an IPv6 address as [ADDR]:PORT", spec));
    addr = spec.substr(1, close - 1);
    port_text = spec.substr(close + 2);
  } else if (auto colon = spec.rfind(':'); colon != std::string::npos) {
    addr = spec.substr(0, colon);
    port_text = spec.substr(colon + 1);
  }
  if (addr.empty())
    throw std::invalid_argument(fmt::format("--dashboard {}: the address before ':' is empty "
                                            "(give PORT alone for loopback)",
                                            spec));
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(port_text, &used);
    if (used != port_text.size())
      port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535)
    throw std::invalid_argument(fmt::format(
        "--dashboard {}: '{}' is not a port (0-65535; 0 picks a free one)", spec, port_text));
  if (addr == "localhost")
    addr = "127.0.0.1";
  beast::error_code ec;
  net::ip::make_address(addr, ec);
  if (ec)
    throw std::invalid_argument(
        fmt::format("--dashboard {}: '{}' is not an IP address of this machine", spec, addr));
  return {addr, static_cast<uint16_t>(port)};
}

bool dashboard_is_loopback(const std::string& address) {
  if (address == "localhost")
    return true;
  beast::error_code ec;
  auto a = net::ip::make_address(address, ec);
  return !ec && a.is_loopback();
}

bool dashboard_host_allowed(const std::string& host_header, const std::vector<std::string>& names) {
  std::string host = host_header;
  if (!host.empty() && host.front() == '[') { // [v6]:port
    auto close = host.find(']');
    if (close == std::string::npos)
      return false;
    host = host.substr(1, close - 1);
  } else if (auto colon = host.find(':'); colon != std::string::npos) {
    if (host.find(':', colon + 1) != std::string::npos)
      return false; // a bare IPv6 address must be bracketed
    host = host.substr(0, colon);
  }
  if (host.empty())
    return false;
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (host == "localhost")
    return true;
  beast::error_code ec;
  net::ip::make_address(host, ec);
  if (!ec)
    return true; // an IP literal: no name to rebind
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return n.size() == host.size()
           && std::equal(n.begin(), n.end(), host.begin(), [](char a, char b) {
                return std::tolower(static_cast<unsigned char>(a)) == b;
              });
  });
}

namespace {

class session : public std::enable_shared_from_this<session> {
public:
  using render =
      std::function<http::response<http::string_body>(const http::request<http::string_body>&)>;
  session(net::ip::tcp::socket s, render r, std::atomic<size_t>& live)
      : stream_(std::move(s)), render_(std::move(r)), live_(live) {
    ++live_;
  }
  ~session() { --live_; }

  void start() {
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, req_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->reading_ = false;
                       if (!ec)
                         self->answer();
                     });
  }
  bool reading() const { return reading_; }
  void close() {
    beast::error_code ignored;
    stream_.socket().close(ignored);
  }

private:
  bool reading_ = true;
  void answer() {
    res_ = render_(req_);
    res_.keep_alive(false);
    res_.prepare_payload();
    stream_.expires_after(std::chrono::seconds(10));
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ignored;
      self->stream_.socket().shutdown(net::ip::tcp::socket::shutdown_send, ignored);
    });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  render render_;
  std::atomic<size_t>& live_;
};

} // namespace

struct dashboard::impl {
  // Connections alive now; declared before the io_context, whose queued handlers hold
  // sessions that count here until it is destroyed.
  std::atomic<size_t> live{0};
  dashboard_options opts;
  net::io_context io{1};
  net::ip::tcp::acceptor acceptor{io};
  std::thread thread;
  mutable std::mutex mutex;
  std::vector<nlohmann::json> events;
  std::atomic<uint64_t> requests{0};
  uint16_t port = 0;
  // Open connections, oldest first (the server's thread only).
  std::list<std::weak_ptr<session>> open;

  std::vector<nlohmann::json> snapshot() const {
    std::lock_guard<std::mutex> lock{mutex};
    return events;
  }

  http::response<http::string_body> respond(const http::request<http::string_body>& req) {
    ++requests;
    http::response<http::string_body> res{http::status::ok, req.version()};
    res.set(http::field::server, "caf-hvd");
    res.set(http::field::cache_control, "no-store");
    // No scripts, nothing loaded from anywhere: the page is inline SVG and CSS.
    res.set("Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:");
    res.set("X-Content-Type-Options", "nosniff");
    auto target = std::string(req.target());
    if (!dashboard_host_allowed(std::string(req[http::field::host]), opts.names)) {
      res.result(http::status::misdirected_request);
      res.set(http::field::content_type, "text/plain");
      res.body() = "this page is served for its address, localhost, or the names given with "
                   "--dashboard-name\n";
    } else if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.set(http::field::allow, "GET, HEAD");
      res.set(http::field::content_type, "text/plain");
      res.body() = "only GET and HEAD\n";
    } else if (target == "/" || target == "/index.html") {
      res.set(http::field::content_type, "text/html; charset=utf-8");
      timeline_options t;
      t.refresh_seconds = opts.refresh_seconds;
      t.now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
      res.body() = timeline_html(snapshot(), opts.title, t);
    } else if (target == "/events.jsonl") {
      res.set(http::field::content_type, "application/x-ndjson");
      std::string body;
      for (auto& e : snapshot())
        body += json_text(e) + "\n";
      res.body() = std::move(body);
    } else if (target == "/trace.json") {
      res.set(http::field::content_type, "application/json");
      res.body() = json_text(timeline_trace(snapshot()));
    } else {
      res.result(http::status::not_found);
      res.set(http::field::content_type, "text/plain");
      res.body() = "not found: the job's page is at /, its events at /events.jsonl, its "
                   "trace at /trace.json\n";
    }
    if (req.method() == http::verb::head) {
      auto size = res.body().size();
      res.body().clear();
      res.content_length(size);
    }
    return res;
  }

  // Keeps at most max_connections open: beyond it, the oldest connection still reading
  // its request is closed (idle ones cannot lock a normal fetch out).
  void admit(std::shared_ptr<session> s) {
    open.remove_if([](auto& w) { return w.expired(); });
    if (open.size() >= opts.max_connections) {
      for (auto it = open.begin(); it != open.end(); ++it)
        if (auto old = it->lock(); old && old->reading()) {
          old->close();
          open.erase(it);
          break;
        }
    }
    if (open.size() >= opts.max_connections)
      return s->close(); // every one is being answered: this one waits for none
    open.push_back(s);
    s->start();
  }

  void accept() {
    acceptor.async_accept([this](beast::error_code ec, net::ip::tcp::socket s) {
      if (ec == net::error::operation_aborted)
        return;
      if (!ec) {
        admit(std::make_shared<session>(
            std::move(s), [this](auto& req) { return respond(req); }, live));
      } else // e.g. out of descriptors: pause instead of spinning
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      accept();
    });
  }
};

dashboard::dashboard(dashboard_options o) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(o);
  beast::error_code ec;
  auto addr = net::ip::make_address(impl_->opts.bind, ec);
  if (!ec)
    ec = listen_on(impl_->acceptor, addr, impl_->opts.port,
                   net::socket_base::max_listen_connections);
  if (ec)
    throw std::runtime_error(fmt::format("the dashboard cannot listen on {}:{}: {}",
                                         impl_->opts.bind, impl_->opts.port, ec.message()));
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  impl_->thread = std::thread{[i = impl_.get()] { i->io.run(); }};
}

dashboard::~dashboard() {
  impl_->io.stop();
  if (impl_->thread.joinable())
    impl_->thread.join();
}

uint16_t dashboard::port() const {
  return impl_->port;
}

const std::string& dashboard::address() const {
  return impl_->opts.bind;
}

void dashboard::add(const nlohmann::json& event) {
  std::lock_guard<std::mutex> lock{impl_->mutex};
  impl_->events.push_back(event);
}

uint64_t dashboard::requests() const {
  return impl_->requests;
}

size_t dashboard::connections() const {
  return impl_->live;
}

} // namespace cafhvd

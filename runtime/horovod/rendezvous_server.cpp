// Rendezvous server on Boost.Beast/Asio. All state lives on the server's one I/O
// thread; sessions are asynchronous, so a thousand waiting ranks cost no threads.
#include "runtime/horovod/rendezvous_server.hpp"
#include "runtime/network/listen.hpp"
#include "runtime/observe/text.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

namespace cafhvd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

std::optional<std::string> percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size())
      return std::nullopt;
    int v = 0;
    auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
    if (ec != std::errc{} || p != s.data() + i + 3)
      return std::nullopt;
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// Progress and parking reports kept per plan (a bound: the clients that could fill it are
// a job's own hosts).
constexpr size_t max_progress_told = 1u << 16;

struct target {
  std::string scope, key;
  std::optional<long> wait_ms;
  bool snapshot = false;
};

// "/<scope>/<key>[?wait_ms=N][&snapshot=1]": exactly two non-empty segments.
std::optional<target> parse_target(std::string_view t) {
  std::string_view query;
  if (auto q = t.find('?'); q != std::string_view::npos) {
    query = t.substr(q + 1);
    t = t.substr(0, q);
  }
  if (t.size() < 4 || t[0] != '/')
    return std::nullopt;
  t.remove_prefix(1);
  auto slash = t.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == t.size()
      || t.find('/', slash + 1) != std::string_view::npos)
    return std::nullopt;
  auto scope = percent_decode(t.substr(0, slash));
  auto key = percent_decode(t.substr(slash + 1));
  if (!scope || !key || scope->empty() || key->empty())
    return std::nullopt;
  target out{*scope, *key, std::nullopt, false};
  while (!query.empty()) {
    auto amp = query.find('&');
    auto param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (param == "snapshot=1") {
      out.snapshot = true;
      continue;
    }
    constexpr std::string_view name = "wait_ms=";
    if (param.substr(0, name.size()) != name)
      return std::nullopt;
    long v = 0;
    auto num = param.substr(name.size());
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc{} || p != num.data() + num.size() || v < 0)
      return std::nullopt;
    out.wait_ms = v;
  }
  return out;
}

std::string scope_snapshot(const kv_store& store, const std::string& scope) {
  std::string out;
  for (auto& [k, v] : store.entries(scope))
    out += fmt::format("{}:{}{}:{}", k.size(), k, v.size(), v);
  return out;
}

} // namespace

std::string slot_key(const std::string& host, int local_rank) {
  return fmt::format("{}:{}", host, local_rank);
}

elastic_request parse_elastic_request(std::string_view raw, long max_wait_ms) {
  constexpr std::string_view ras = "/rank_and_size/";
  constexpr std::string_view upd = "/elastic/update";
  elastic_request r;
  if (raw.substr(0, ras.size()) == ras) {
    auto slot = percent_decode(raw.substr(ras.size()));
    auto colon = slot ? slot->rfind(':') : std::string::npos;
    int lr = -1;
    if (colon != std::string::npos && colon > 0) {
      auto num = std::string_view{*slot}.substr(colon + 1);
      auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), lr);
      if (ec != std::errc{} || p != num.data() + num.size() || num.empty())
        lr = -1;
    }
    if (lr < 0 || slot->find('/') != std::string::npos || slot->find('?') != std::string::npos) {
      r.what = elastic_request::kind::bad;
      r.error = "expected /rank_and_size/<host>:<local_rank>\n";
      return r;
    }
    r.host = slot->substr(0, colon);
    r.local_rank = lr;
    if (!valid_host_name(r.host)) {
      r.what = elastic_request::kind::bad;
      r.bad_name = true;
      r.error = "expected /rank_and_size/<host>:<local_rank>, the host's name of letters, "
                "digits, '.', '-' or '_'\n";
      return r;
    }
    r.what = elastic_request::kind::rank_and_size;
    return r;
  }
  if (raw.substr(0, upd.size()) != upd)
    return r;
  auto bad = [&] {
    r.what = elastic_request::kind::bad;
    r.error = "expected /elastic/update[?after=G&wait_ms=N]\n";
    return r;
  };
  auto query = raw.substr(upd.size());
  r.what = elastic_request::kind::update;
  if (query.empty())
    return r;
  if (query[0] != '?')
    return bad();
  query.remove_prefix(1);
  while (!query.empty()) {
    auto amp = query.find('&');
    auto param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    auto eq = param.find('=');
    auto name = param.substr(0, eq);
    auto num = eq == std::string_view::npos ? std::string_view{} : param.substr(eq + 1);
    long long v = -1;
    auto [p, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc{} || p != num.data() + num.size() || v < 0
        || (name != "after" && name != "wait_ms"))
      return bad();
    if (name == "after")
      r.after = static_cast<uint64_t>(v);
    else
      r.wait_ms = static_cast<long>(std::min<long long>(v, max_wait_ms));
  }
  return r;
}

rendezvous_answer answer_request(kv_store& store, std::string_view method,
                                 std::string_view target_text, std::string body, bool has_length) {
  auto t = parse_target(target_text);
  if (!t)
    return {400, "expected /<scope>/<key>\n", false, 0};
  if (method == "PUT") {
    if (!has_length)
      return {411, "Content-Length required\n", true, 0};
    auto r = store.put(t->scope, t->key, std::move(body));
    if (r == kv_store::put_result::ok)
      return {200, "", false, 0};
    return {413, r == kv_store::put_result::too_large ? "value too large\n" : "store full\n", false,
            0};
  }
  if (method == "GET") {
    auto v = store.get(t->scope, t->key);
    if (v)
      return {200, t->snapshot ? scope_snapshot(store, t->scope) : std::move(*v), false, 0};
    if (t->wait_ms && *t->wait_ms > 0)
      return {0, "", false, *t->wait_ms};
    return {404, "", false, 0};
  }
  if (method == "DELETE") {
    store.finish(t->scope, t->key);
    return {200, "", false, 0};
  }
  return {405, "", true, 0};
}

struct rendezvous_server::impl {
  // Budgets (server thread only; mirrored into atomics for stats()). Declared before
  // the io_context: sessions still queued in it are destroyed with it and leave these.
  size_t connections = 0, held_count = 0, polls = 0;
  std::map<net::ip::address, size_t> conns_of, polls_of; // per client (not loopback)
  std::atomic<uint64_t> requests{0}, rejected{0}, refused{0}, accept_errors{0}, held_refused{0},
      polls_cut{0}, strangers{0};
  void refuse_stranger(const std::string& addr, const std::string& what,
                       std::string_view why = "not an address of this job's hosts") {
    ++strangers;
    report_refusal(addr, what, why);
  }
  // Once per address and what (bounded by the allowlist), escaped: `what` may carry a
  // client's bytes.
  void report_refusal(const std::string& addr, const std::string& what, std::string_view why) {
    if (!opts.on_refused || !opts.allowlist)
      return;
    auto note = opts.allowlist->note_refusal("rendezvous", addr + what + std::string{why});
    if (note == address_allowlist::refusal_note::quiet)
      return;
    opts.on_refused(fmt::format(
        "the rendezvous server refused {} from {}: {}{}", printable(what), addr, why,
        note == address_allowlist::refusal_note::last ? " (further refusals are counted, not shown)"
                                                      : ""));
  }
  // A request of an admitted client that the server turns down (the store's budgets, a
  // DELETE that names no rank, a malformed target): Horovod's client tries three times and
  // then aborts the rank without a word on why, so the operator hears which request and
  // why. Once per client, method, scope and answer (report_refusal's bound); never per
  // key, whose variety is the client's to choose.
  static std::string_view reason_of(int status) {
    auto r = http::obsolete_reason(static_cast<http::status>(status));
    return {r.data(), r.size()};
  }
  void report_answer(const std::string& addr, std::string_view method, std::string_view scope,
                     int status, std::string_view body) {
    while (!body.empty() && body.back() == '\n')
      body.remove_suffix(1);
    report_refusal(addr, fmt::format("a {} in scope {}", method, scope),
                   fmt::format("{} {}", status,
                               body.empty() ? reason_of(status) : body));
  }
  void report_held_full(const std::string& addr, const std::string& what) {
    report_refusal(addr, what, fmt::format("503 {} requests are held already", opts.max_held));
  }
  std::atomic<size_t> now_connections{0}, now_held{0}, now_polls{0};
  rendezvous_options opts;
  net::io_context io{1};
  kv_store store;
  std::thread thread;
  std::string address;
  uint16_t port = 0;
  void publish() {
    now_connections = connections;
    now_held = held_count;
    now_polls = polls;
  }

  struct session;
  void accept(std::shared_ptr<tcp::acceptor> on, uint64_t lot);
  std::shared_ptr<tcp::acceptor> main_acceptor;

  // warm joins: lots whose requests are held until released
  struct lot_state {
    std::shared_ptr<tcp::acceptor> acceptor;
    bool released = false;
    std::vector<std::pair<std::shared_ptr<session>, http::request<http::string_body>>> held;
    std::set<std::pair<int, std::string>> told; // (rank, client address)
  };
  std::map<uint64_t, lot_state> lots;
  std::function<void(uint64_t, int, const std::string&)> on_parked;

  // elastic endpoints (server thread only)
  std::function<void(const std::string&, int)> on_vote;
  std::function<void(const std::string&, int, const std::string&)> on_register;
  std::map<std::string, std::vector<std::shared_ptr<session>>> held; // slot -> requests
  uint64_t update_generation = 0;
  std::string update_text;
  std::vector<std::pair<uint64_t, std::shared_ptr<session>>> update_waiters;
  void wake_update_waiters();

  // Gloo rendezvous progress of the served plan's ranks (each reported once per plan)
  // (told once per scope, rank, kind and client address: the caller decides which
  // client speaks for the rank, so one that cannot takes nobody's report away)
  std::function<void(uint64_t, const std::string&, int, bool, const std::string&)> on_progress;
  std::set<std::tuple<std::string, int, bool, std::string>> progress_told;
  void note_progress(http::verb verb, const std::string& scope, const std::string& key,
                     const std::string& client) {
    if (!on_progress || (scope != "global" && scope.compare(0, 6, "cross_") != 0))
      return;
    bool connected = verb == http::verb::delete_;
    std::string_view digits = key;
    if (!connected) {
      if (digits.substr(0, 5) != "rank_")
        return;
      digits.remove_prefix(5);
    }
    auto r = canonical_rank(digits);
    if (!r)
      return;
    int rank = *r;
    auto size = store.scope_size(scope); // a planned scope only
    if (!size || rank >= *size || progress_told.size() >= max_progress_told
        || !progress_told.insert({scope, rank, connected, client}).second)
      return;
    on_progress(store.generation(), scope, rank, connected, client);
  }

  // The listening addresses Gloo ranks published since the last plan. Kept apart from
  // the store, whose keys a rank deletes when it shuts Horovod down (which the ranks of a
  // broken generation do before their peers' connections are aborted).
  std::set<tcp_endpoint> gloo;
  void note_gloo_addresses(const std::string& value, const std::vector<std::string>& hosts) {
    constexpr size_t max_gloo = 1u << 20;
    for (auto& e : gloo_addresses(value)) {
      if (opts.allowlist && std::none_of(hosts.begin(), hosts.end(), [&](auto& h) {
            return opts.allowlist->speaks_for(h, endpoint_address(e));
          }))
        continue; // a listener elsewhere than on the rank's host is not the rank's
      if (gloo.size() < max_gloo)
        gloo.insert(e);
    }
  }
  // "10.0.0.1" of 10.0.0.1:80, "fe80::1" of [fe80::1]:80
  static std::string endpoint_address(const tcp_endpoint& e) {
    auto s = e.str();
    s = s.substr(0, s.rfind(':'));
    if (s.size() >= 2 && s.front() == '[')
      s = s.substr(1, s.size() - 2);
    return s;
  }
};

struct rendezvous_server::impl::session : std::enable_shared_from_this<session> {
  // What the connection counts against: reading/answering (ordinary), a held
  // rank_and_size request, or a long poll.
  enum class mode { ordinary, held, polling };
  impl& srv;
  net::ip::address client;
  bool counted_client = false; // loopback clients are not counted per client
  mode m = mode::ordinary;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  net::steady_timer wait_timer;
  uint64_t waiter = 0;
  bool keep_alive = true; // of a held elastic request
  uint64_t lot = 0;       // accepted on a parking lot's port (0: the main port)

  session(impl& s, tcp::socket sock, net::ip::address from, uint64_t lot_id)
      : srv(s), client(from), counted_client(!(s.opts.loopback_exempt && from.is_loopback())),
        stream(std::move(sock)), wait_timer(srv.io), lot(lot_id) {
    ++srv.connections;
    if (counted_client)
      ++srv.conns_of[client];
    srv.publish();
  }
  ~session() { leave(); }

  // Takes the connection out of the budget it counts against.
  void leave() {
    switch (m) {
    case mode::ordinary:
      --srv.connections;
      if (counted_client && --srv.conns_of[client] == 0)
        srv.conns_of.erase(client);
      break;
    case mode::held:
      --srv.held_count;
      break;
    case mode::polling:
      --srv.polls;
      if (counted_client && --srv.polls_of[client] == 0)
        srv.polls_of.erase(client);
      break;
    }
    srv.publish();
  }
  void enter(mode to) {
    if (to == m)
      return;
    leave();
    m = to;
    switch (m) {
    case mode::ordinary:
      ++srv.connections;
      if (counted_client)
        ++srv.conns_of[client];
      break;
    case mode::held:
      ++srv.held_count;
      break;
    case mode::polling:
      ++srv.polls;
      if (counted_client)
        ++srv.polls_of[client];
      break;
    }
    srv.publish();
  }
  // Whether one more long poll fits, overall and for this client.
  bool poll_fits() const {
    if (srv.polls >= srv.opts.max_long_polls)
      return false;
    if (!counted_client)
      return true;
    auto it = srv.polls_of.find(client);
    return it == srv.polls_of.end() || it->second < srv.opts.max_long_polls_per_client;
  }

  void read() {
    parser.emplace();
    parser->body_limit(srv.opts.limits.max_value);
    parser->header_limit(16 * 1024);
    stream.expires_after(srv.opts.request_timeout);
    http::async_read(
        stream, buffer, *parser,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout
        || ec == net::error::connection_reset || ec == net::error::eof) {
      close();
      return;
    }
    if (ec == http::error::body_limit) {
      ++srv.rejected;
      srv.report_refusal(client.to_string(), "a request",
                         fmt::format("413 its value is over {} bytes", srv.opts.limits.max_value));
      return reply(http::status::payload_too_large, "value too large\n", false);
    }
    if (ec) {
      ++srv.rejected;
      return reply(http::status::bad_request, "malformed request\n", false);
    }
    ++srv.requests;
    handle(parser->release());
  }

  void handle(http::request<http::string_body> req) {
    if (lot != 0) {
      auto it = srv.lots.find(lot);
      if (it == srv.lots.end())
        return close(); // the lot was closed: its plan will not run
      if (!it->second.released)
        return park(it->second, std::move(req));
    }
    bool keep = req.keep_alive();
    auto raw = req.target();
    auto verb = req.method_string();
    if (srv.on_vote && req.method() == http::verb::get) {
      if (parse_elastic_target(std::string_view{raw.data(), raw.size()}, keep))
        return;
    }
    auto t = parse_target(std::string_view{raw.data(), raw.size()});
    auto addr = client.to_string();
    // Horovod workers' notification registrations (with their HMAC keys) are the
    // driver's alone: it reads them from the server, never over the network.
    if (t && t->scope == "worker_addresses" && req.method() == http::verb::get) {
      srv.report_refusal(addr, "a read of scope worker_addresses",
                         "registrations are read by the driver only");
      ++srv.rejected;
      return reply(http::status::forbidden, "worker_addresses is read by the driver only\n", keep);
    }
    // A rank's own keys in a planned scope (Gloo's PUT rank_<r>, Horovod's DELETE <r>)
    // come from the host of that rank only; the rest of a planned scope is read and
    // written by the hosts whose ranks use it.
    const std::string* owner = nullptr;
    if (t)
      if (auto r = rank_of_key(req.method(), t->key))
        owner = srv.store.rank_host(t->scope, *r);
    // Horovod's DELETE of a planned scope names a rank of it; any other key would count
    // as one more finished rank and clear the scope under the ranks still reading it.
    if (t && req.method() == http::verb::delete_ && srv.store.scope_size(t->scope) && !owner) {
      ++srv.rejected;
      auto why = fmt::format("DELETE /{}/<rank> names a rank of the scope (0 to {})\n",
                             printable(t->scope), *srv.store.scope_size(t->scope) - 1);
      srv.report_answer(addr, "DELETE", t->scope, 400, why);
      return reply(http::status::bad_request, std::move(why), keep);
    }
    if (srv.opts.allowlist && t) {
      bool write = req.method() != http::verb::get;
      if (owner && !srv.opts.allowlist->speaks_for(*owner, addr)) {
        srv.refuse_stranger(addr, fmt::format("a write of key {} of scope {}", t->key, t->scope),
                            "not an address of the host of that rank");
        ++srv.rejected;
        return reply(http::status::forbidden,
                     fmt::format("key {} of scope {} is written only by its rank's host\n",
                                 printable(t->key), printable(t->scope)),
                     keep);
      }
      if (!owner && !scope_member(t->scope)) {
        srv.refuse_stranger(addr,
                            fmt::format("a {} scope {}", write ? "write to" : "read of", t->scope),
                            "not an address of the hosts whose ranks use that scope");
        ++srv.rejected;
        return reply(http::status::forbidden,
                     fmt::format("scope {} is {} only by its own hosts\n", printable(t->scope),
                                 write ? "written" : "read"),
                     keep);
      }
    }
    std::optional<std::pair<std::string, int>> registering;
    if (req.method() == http::verb::put && t && t->scope == "worker_addresses") {
      registering = parse_registration(std::string_view{raw.data(), raw.size()});
      if (!registering || !valid_host_name(registering->first)) {
        ++srv.rejected;
        srv.report_refusal(addr, fmt::format("a notification service for slot '{}'", t->key),
                           "not <host>:<local_rank> of a host name");
        return reply(http::status::bad_request,
                     "expected /worker_addresses/<host>:<local_rank>, the host's name of "
                     "letters, digits, '.', '-' or '_'\n",
                     keep);
      }
      if (srv.opts.allowlist && !srv.opts.allowlist->speaks_for(registering->first, addr)) {
        srv.refuse_stranger(addr,
                            fmt::format("a notification service for host {}", registering->first));
        ++srv.rejected;
        return reply(
            http::status::forbidden,
            fmt::format("a worker of host {} registers from that host\n", registering->first),
            keep);
      }
    }
    if (!srv.on_register)
      registering.reset(); // stored as any key; nobody is told
    std::string registered_body;
    if (registering)
      registered_body = req.body();
    // The Gloo listeners a job's abort may cut: only from a rank's own key <r>, and only
    // addresses of that rank's host (never another server a neighbour names). In the
    // scopes of a process set other than 0, whose rank numbers are not the plan's, the
    // rank's host is one of the set's hosts the client speaks for.
    if (req.method() == http::verb::put && t && t->key.compare(0, 5, "rank_") != 0) {
      if (owner)
        srv.note_gloo_addresses(req.body(), {*owner});
      else if (canonical_rank(t->key) && !srv.store.ranks_known(t->scope))
        if (auto* hosts = srv.store.scope_hosts(t->scope)) {
          std::vector<std::string> own;
          for (auto& h : *hosts)
            if (!srv.opts.allowlist || srv.opts.allowlist->speaks_for(h, addr))
              own.push_back(h);
          srv.note_gloo_addresses(req.body(), own);
        }
    }
    auto a = answer_request(srv.store, std::string_view{verb.data(), verb.size()},
                            std::string_view{raw.data(), raw.size()}, std::move(req.body()),
                            req.has_content_length() || req.chunked());
    if (registering && a.status == 200)
      srv.on_register(registering->first, registering->second, registered_body);
    if (a.status >= 400) {
      ++srv.rejected;
      if (a.status != 404) // 404: a key not there yet, which clients poll for
        srv.report_answer(addr, std::string_view{verb.data(), verb.size()},
                          t ? std::string_view{t->scope} : std::string_view{"(none)"}, a.status,
                          a.body);
    } else if (req.method() == http::verb::put || req.method() == http::verb::delete_)
      if (auto t = parse_target(std::string_view{raw.data(), raw.size()}))
        srv.note_progress(req.method(), t->scope, t->key, client.to_string());
    if (a.wait_ms > 0) {
      auto t = parse_target(std::string_view{raw.data(), raw.size()});
      return long_poll(*t, keep);
    }
    http::response<http::string_body> res{static_cast<http::status>(a.status), 11u};
    if (a.status == 405)
      res.set(http::field::allow, "GET, PUT, DELETE");
    res.body() = std::move(a.body);
    res.keep_alive(keep && !a.close);
    res.prepare_payload(); // always sets Content-Length, which Horovod's client needs
    send(std::move(res));
  }

  // A request on a lot not released yet: held, the store untouched, until the release.
  void park(lot_state& l, http::request<http::string_body> req) {
    if (srv.held_count >= srv.opts.max_held) {
      ++srv.held_refused;
      ++srv.rejected;
      srv.report_held_full(client.to_string(), "a request held until its plan's release");
      return reply(http::status::service_unavailable, "too many held requests\n", req.keep_alive());
    }
    enter(mode::held);
    stream.expires_never();
    int rank = -1;
    if (req.method() == http::verb::put) {
      auto raw = req.target();
      auto t = parse_target(std::string_view{raw.data(), raw.size()});
      if (t && t->scope == "global" && t->key.compare(0, 5, "rank_") == 0)
        if (auto r = canonical_rank(std::string_view{t->key}.substr(5)))
          rank = *r;
    }
    l.held.emplace_back(shared_from_this(), std::move(req));
    auto from = client.to_string();
    if (rank >= 0 && srv.on_parked && l.told.size() < max_progress_told
        && l.told.insert({rank, from}).second)
      srv.on_parked(lot, rank, from);
  }

  // "/worker_addresses/<host>:<local_rank>" -> (host, local rank); nullopt otherwise.
  static std::optional<std::pair<std::string, int>> parse_registration(std::string_view raw) {
    auto t = parse_target(raw);
    if (!t || t->scope != "worker_addresses")
      return std::nullopt;
    auto colon = t->key.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == t->key.size()
        || colon + 6 < t->key.size())
      return std::nullopt;
    int lr = 0;
    for (size_t i = colon + 1; i < t->key.size(); ++i) {
      if (t->key[i] < '0' || t->key[i] > '9')
        return std::nullopt;
      lr = lr * 10 + (t->key[i] - '0');
    }
    return std::make_pair(t->key.substr(0, colon), lr);
  }

  // The elastic endpoints; returns false when the target is none of them.
  bool parse_elastic_target(std::string_view raw, bool keep) {
    auto r = parse_elastic_request(raw, static_cast<long>(srv.opts.max_wait.count()));
    switch (r.what) {
    case elastic_request::kind::none:
      return false;
    case elastic_request::kind::bad:
      ++srv.rejected;
      if (r.bad_name)
        srv.report_refusal(client.to_string(), fmt::format("a vote for host '{}'", r.host),
                           "not a host name");
      reply(http::status::bad_request, r.error, keep);
      return true;
    case elastic_request::kind::rank_and_size: {
      if (srv.opts.allowlist && !srv.opts.allowlist->speaks_for(r.host, client.to_string())) {
        srv.refuse_stranger(client.to_string(), fmt::format("a vote for host {}", r.host));
        ++srv.rejected;
        reply(http::status::forbidden,
              fmt::format("a vote for host {} must come from that host\n", r.host), keep);
        return true;
      }
      if (srv.held_count >= srv.opts.max_held) {
        ++srv.held_refused;
        ++srv.rejected;
        srv.report_held_full(client.to_string(), fmt::format("a vote for host {}", r.host));
        reply(http::status::service_unavailable, "too many held rank_and_size requests\n", keep);
        return true;
      }
      enter(mode::held);
      keep_alive = keep;
      stream.expires_never();
      auto slot = slot_key(r.host, r.local_rank);
      srv.held[slot].push_back(shared_from_this());
      srv.on_vote(r.host, r.local_rank);
      return true;
    }
    case elastic_request::kind::update:
      break;
    }
    if (srv.update_generation > r.after || r.wait_ms == 0) {
      reply(http::status::ok, srv.update_text, keep);
      return true;
    }
    if (!poll_fits()) { // answered as if the wait had ended: the client polls again
      ++srv.polls_cut;
      reply(http::status::ok, srv.update_text, keep);
      return true;
    }
    enter(mode::polling);
    keep_alive = keep;
    stream.expires_never();
    auto self = shared_from_this();
    srv.update_waiters.emplace_back(r.after, self);
    wait_timer.expires_after(std::chrono::milliseconds(r.wait_ms));
    wait_timer.async_wait([self](beast::error_code ec) {
      if (ec)
        return;
      auto& w = self->srv.update_waiters;
      auto it = std::find_if(w.begin(), w.end(), [&](auto& p) { return p.second == self; });
      if (it == w.end())
        return;
      w.erase(it);
      self->reply(http::status::ok, self->srv.update_text, self->keep_alive);
    });
    return true;
  }

  // Whether the client speaks for a host whose ranks use `scope` (any client of the job
  // for an ad-hoc scope).
  bool scope_member(const std::string& scope) const {
    auto* hosts = srv.store.scope_hosts(scope);
    if (!hosts)
      return true;
    auto addr = client.to_string();
    return std::any_of(hosts->begin(), hosts->end(),
                       [&](auto& h) { return srv.opts.allowlist->speaks_for(h, addr); });
  }

  // The rank whose own key this is, in Gloo's connectFullMesh: PUT rank_<r> (its host's
  // name), PUT <r> (its pairs' listening addresses); and DELETE <r> (Horovod's finish of
  // a scope).
  static std::optional<int> rank_of_key(http::verb verb, std::string_view key) {
    if (verb == http::verb::put) {
      if (key.substr(0, 5) == "rank_")
        key.remove_prefix(5);
    } else if (verb != http::verb::delete_) {
      return std::nullopt;
    }
    return canonical_rank(key);
  }

  // Every key of the scope, framed as <len>:<key><len>:<value>... (our own clients
  // cache the peers' values from one answer instead of asking for each).
  std::string snapshot(const std::string& scope) { return scope_snapshot(srv.store, scope); }

  // Holds the request until the key exists or the wait ends; then 200 or 404.
  void long_poll(const target& t, bool keep) {
    if (!poll_fits()) { // answered as if the wait had ended: the client asks again
      ++srv.polls_cut;
      return reply(http::status::not_found, "", keep);
    }
    enter(mode::polling);
    stream.expires_never();
    auto wait = std::min<long>(*t.wait_ms, static_cast<long>(srv.opts.max_wait.count()));
    waiter =
        srv.store.wait(t.scope, t.key,
                       [self = shared_from_this(), keep, snap = t.snapshot,
                        scope = t.scope](const std::optional<std::string>& v) {
                         self->waiter = 0;
                         self->wait_timer.cancel();
                         if (v)
                           self->reply(http::status::ok, snap ? self->snapshot(scope) : *v, keep);
                         else
                           self->reply(http::status::not_found, "", keep);
                       });
    if (waiter == 0)
      return; // answered at once
    wait_timer.expires_after(std::chrono::milliseconds(wait));
    wait_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->waiter != 0)
        self->srv.store.cancel_wait(self->waiter);
    });
  }

  void reply(http::status status, std::string body, bool keep) {
    http::response<http::string_body> res{status, 11};
    res.body() = std::move(body);
    res.keep_alive(keep);
    res.prepare_payload(); // always sets Content-Length, which Horovod's client needs
    send(std::move(res));
  }

  void send(http::response<http::string_body> res) {
    enter(mode::ordinary); // answered: back to the ordinary budget
    auto sp = std::make_shared<http::response<http::string_body>>(std::move(res));
    stream.expires_after(srv.opts.request_timeout);
    http::async_write(stream, *sp, [self = shared_from_this(), sp](beast::error_code ec, size_t) {
      if (ec || !sp->keep_alive())
        return self->close();
      self->read();
    });
  }

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  }
};

void rendezvous_server::impl::wake_update_waiters() {
  std::vector<std::pair<uint64_t, std::shared_ptr<session>>> keep;
  for (auto& [after, s] : update_waiters) {
    if (update_generation > after) {
      s->wait_timer.cancel();
      s->reply(http::status::ok, update_text, s->keep_alive);
    } else {
      keep.emplace_back(after, s);
    }
  }
  update_waiters.swap(keep);
}

void rendezvous_server::impl::accept(std::shared_ptr<tcp::acceptor> on, uint64_t lot) {
  on->async_accept([this, on, lot](beast::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || !on->is_open())
      return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: the pending connection stays queued, so
      // accepting again at once would spin; try again a little later.
      ++accept_errors;
      auto timer = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(50));
      timer->async_wait([this, on, lot, timer](beast::error_code e) {
        if (e != net::error::operation_aborted)
          accept(on, lot);
      });
      return;
    }
    {
      beast::error_code peer_ec;
      auto from = sock.remote_endpoint(peer_ec).address();
      bool over = connections >= opts.max_connections;
      if (!over && !peer_ec && !(opts.loopback_exempt && from.is_loopback())) {
        auto it = conns_of.find(from);
        over = it != conns_of.end() && it->second >= opts.max_connections_per_client;
      }
      std::string refusal;
      if (!over && !peer_ec && opts.allowlist)
        refusal = opts.allowlist->refusal(from.to_string(), owner_of_peer(sock.native_handle()));
      if (!refusal.empty()) {
        refuse_stranger(from.to_string(), "a connection", refusal);
        beast::error_code ignored;
        sock.close(ignored);
      } else if (over || peer_ec) {
        ++refused;
        if (over) // a client gone before its accept (peer_ec) waits for nothing
          report_refusal(from.to_string(), "a connection",
                         fmt::format("its connections are at the server's limit ({}, {} a "
                                     "client)",
                                     opts.max_connections, opts.max_connections_per_client));
        beast::error_code ignored;
        sock.close(ignored);
      } else {
        sock.set_option(tcp::no_delay(true), ec);
        std::make_shared<session>(*this, std::move(sock), from, lot)->read();
      }
    }
    accept(on, lot);
  });
}

rendezvous_server::rendezvous_server(rendezvous_options opts) : impl_(std::make_unique<impl>()) {
  auto& m = *impl_;
  m.opts = std::move(opts);
  m.store = kv_store{m.opts.limits};
  beast::error_code ec;
  auto addr = net::ip::make_address(m.opts.bind, ec);
  if (ec)
    throw std::runtime_error(
        fmt::format("rendezvous server: '{}' is not an IP address", m.opts.bind));
  m.main_acceptor = std::make_shared<tcp::acceptor>(m.io);
  ec = listen_on(*m.main_acceptor, addr, m.opts.port, 4096);
  if (ec)
    throw std::runtime_error(fmt::format("rendezvous server: cannot listen on {}:{}: {}",
                                         m.opts.bind, m.opts.port, ec.message()));
  m.port = m.main_acceptor->local_endpoint().port();
  m.address = m.opts.bind;
  m.accept(m.main_acceptor, 0);
  m.thread = std::thread{[&m] { m.io.run(); }};
}

rendezvous_server::~rendezvous_server() {
  net::post(impl_->io, [&m = *impl_] {
    beast::error_code ignored;
    m.main_acceptor->close(ignored);
    for (auto& [id, l] : m.lots)
      l.acceptor->close(ignored);
    m.io.stop();
  });
  impl_->thread.join();
}

uint16_t rendezvous_server::port() const {
  return impl_->port;
}

const std::string& rendezvous_server::address() const {
  return impl_->address;
}

namespace {

// Runs `f` on the server's thread and waits for its result (the setters and queries that
// callers make from their own threads).
template <class F> auto on_server_thread(net::io_context& io, F f) -> decltype(f()) {
  using result = decltype(f());
  std::promise<result> done;
  net::post(io, [&] {
    if constexpr (std::is_void_v<result>) {
      f();
      done.set_value();
    } else {
      done.set_value(f());
    }
  });
  return done.get_future().get();
}

} // namespace

uint64_t rendezvous_server::init(const std::vector<slot_info>& plan) {
  return on_server_thread(impl_->io, [&] {
    impl_->gloo.clear();
    impl_->progress_told.clear();
    return impl_->store.init(plan);
  });
}

void rendezvous_server::enable_elastic(
    std::function<void(const std::string&, int)> on_vote,
    std::function<void(const std::string&, int, const std::string&)> on_register) {
  on_server_thread(impl_->io, [&] {
    impl_->on_vote = std::move(on_vote);
    impl_->on_register = std::move(on_register);
  });
}

void rendezvous_server::release(const std::vector<slot_info>& plan) {
  net::post(impl_->io, [&m = *impl_, plan] {
    m.store.init(plan);
    m.gloo.clear();
    m.progress_told.clear();
    std::map<std::string, std::string> rows;
    for (auto& s : plan)
      rows[slot_key(s.hostname, s.local_rank)] = s.to_response_string();
    auto held = std::move(m.held);
    m.held.clear();
    for (auto& [slot, sessions] : held) {
      auto it = rows.find(slot);
      auto body = it == rows.end() ? std::string{slot_not_in_job} : it->second;
      for (auto& s : sessions)
        s->reply(http::status::ok, body, s->keep_alive);
    }
  });
}

std::set<tcp_endpoint> rendezvous_server::gloo_endpoints() const {
  return on_server_thread(impl_->io, [&] { return impl_->gloo; });
}

void rendezvous_server::answer_slot(const std::string& slot, const std::string& body) {
  net::post(impl_->io, [&m = *impl_, slot, body] {
    auto it = m.held.find(slot);
    if (it == m.held.end())
      return;
    auto sessions = std::move(it->second);
    m.held.erase(it);
    for (auto& s : sessions)
      s->reply(http::status::ok, body, s->keep_alive);
  });
}

void rendezvous_server::on_gloo_progress(
    std::function<void(uint64_t, const std::string&, int, bool, const std::string&)> fn) {
  on_server_thread(impl_->io, [&] { impl_->on_progress = std::move(fn); });
}

uint16_t rendezvous_server::open_lot(uint64_t id) {
  auto port = on_server_thread(impl_->io, [&]() -> uint16_t {
    auto& m = *impl_;
    if (auto it = m.lots.find(id); it != m.lots.end())
      return it->second.acceptor->local_endpoint().port();
    auto acc = std::make_shared<tcp::acceptor>(m.io);
    beast::error_code ec;
    auto addr = net::ip::make_address(m.address, ec);
    if (!ec)
      ec = listen_on(*acc, addr, 0, 1024);
    if (ec)
      return 0;
    m.lots[id].acceptor = acc;
    m.accept(acc, id);
    return acc->local_endpoint().port();
  });
  if (port == 0)
    throw std::runtime_error(
        fmt::format("rendezvous server: cannot open a port for newcomers on {}", impl_->address));
  return port;
}

void rendezvous_server::on_parked(std::function<void(uint64_t, int, const std::string&)> fn) {
  on_server_thread(impl_->io, [&] { impl_->on_parked = std::move(fn); });
}

void rendezvous_server::release_lot(uint64_t id) {
  net::post(impl_->io, [&m = *impl_, id] {
    auto it = m.lots.find(id);
    if (it == m.lots.end() || it->second.released)
      return;
    it->second.released = true;
    auto held = std::move(it->second.held);
    for (auto& [session, req] : held)
      session->handle(std::move(req));
  });
}

void rendezvous_server::close_lot(uint64_t id) {
  net::post(impl_->io, [&m = *impl_, id] {
    auto it = m.lots.find(id);
    if (it == m.lots.end())
      return;
    beast::error_code ignored;
    it->second.acceptor->close(ignored);
    auto held = std::move(it->second.held);
    m.lots.erase(it);
    for (auto& [session, req] : held)
      session->close();
  });
}

void rendezvous_server::set_update(uint64_t generation, const std::string& text) {
  net::post(impl_->io, [&m = *impl_, generation, text] {
    m.update_generation = generation;
    m.update_text = text;
    m.wake_update_waiters();
  });
}

rendezvous_stats rendezvous_server::stats() const {
  rendezvous_stats st;
  st.requests = impl_->requests.load();
  st.rejected = impl_->rejected.load();
  st.connections_refused = impl_->refused.load();
  st.accept_errors = impl_->accept_errors.load();
  st.held_refused = impl_->held_refused.load();
  st.polls_cut = impl_->polls_cut.load();
  st.strangers = impl_->strangers.load();
  st.connections = impl_->now_connections.load();
  st.held = impl_->now_held.load();
  st.long_polls = impl_->now_polls.load();
  return st;
}

} // namespace cafhvd

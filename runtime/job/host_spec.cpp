// Parsers for host specs and hostfiles; every error says what was expected and what came.
#include "runtime/job/host_spec.hpp"

#include <algorithm>
#include <charconv>
#include <set>

#include <fmt/format.h>

namespace cafhvd {

namespace {

std::string_view trim(std::string_view s) {
  auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && ws(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && ws(s.back()))
    s.remove_suffix(1);
  return s;
}

bool valid_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.'
         || c == '-' || c == '_';
}

std::string check_host(std::string_view host, std::string_view context) {
  if (host.empty())
    throw spec_error(fmt::format("empty host name in '{}'", context));
  auto bad = std::find_if_not(host.begin(), host.end(), valid_host_char);
  if (bad != host.end())
    throw spec_error(fmt::format("invalid character '{}' in host name '{}' (in '{}'); expected "
                                 "letters, digits, '.', '-' or '_'",
                                 *bad, host, context));
  return std::string{host};
}

} // namespace

std::vector<std::string_view> split_on(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? pos : pos - start));
    if (pos == std::string_view::npos)
      return out;
    start = pos + 1;
  }
}

namespace {

void reject_duplicates(const std::vector<host_spec>& hosts, std::string_view context) {
  std::set<std::string> seen;
  for (auto& h : hosts)
    if (!seen.insert(h.endpoint()).second)
      throw spec_error(
          fmt::format("host {} is listed twice in {}; list each node agent once with its total "
                      "slots",
                      h.endpoint(), context));
}

} // namespace

long long parse_bounded_int(std::string_view text, long long lo, long long hi,
                            std::string_view what) {
  text = trim(text);
  long long value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || ptr != text.data() + text.size())
    throw spec_error(fmt::format("{}: expected an integer, got '{}'", what, text));
  if (value < lo || value > hi)
    throw spec_error(fmt::format("{}: {} is out of range [{}, {}]", what, value, lo, hi));
  return value;
}

host_spec parse_host_spec(std::string_view text, uint16_t default_port) {
  auto item = trim(text);
  auto parts = split_on(item, ':');
  host_spec h;
  h.port = default_port;
  if (parts.size() == 2) {
    h.host = check_host(parts[0], item);
    auto v = parse_bounded_int(parts[1], 1, 65535, fmt::format("slots of host spec '{}'", item));
    // HOST:N is Horovod's HOST:SLOTS; a number no host runs as many ranks of is a port
    // written where the slots go.
    if (v > max_short_spec_slots)
      throw spec_error(fmt::format("'{}': {} is more slots than a host runs (HOST:SLOTS takes at "
                                   "most {}); for a node agent on port {} write {}:{}:SLOTS",
                                   item, v, max_short_spec_slots, v, h.host, v));
    h.slots = static_cast<uint32_t>(v);
  } else if (parts.size() == 3) {
    h.host = check_host(parts[0], item);
    h.port = static_cast<uint16_t>(
        parse_bounded_int(parts[1], 1, 65535, fmt::format("port of host spec '{}'", item)));
    h.slots = static_cast<uint32_t>(
        parse_bounded_int(parts[2], 1, 1 << 20, fmt::format("slots of host spec '{}'", item)));
  } else {
    throw spec_error(
        fmt::format("invalid host spec '{}': expected HOST:SLOTS or HOST:PORT:SLOTS", item));
  }
  return h;
}

std::vector<host_spec> parse_host_list(std::string_view text, uint16_t default_port) {
  if (trim(text).empty())
    throw spec_error("empty host list: expected HOST:SLOTS[,HOST:PORT:SLOTS...]");
  std::vector<host_spec> out;
  for (auto item : split_on(text, ',')) {
    if (trim(item).empty())
      throw spec_error(fmt::format("empty item in host list '{}'", text));
    out.push_back(parse_host_spec(item, default_port));
  }
  reject_duplicates(out, fmt::format("host list '{}'", text));
  return out;
}

std::vector<host_spec> parse_hostfile(std::istream& in, std::string_view name,
                                      uint16_t default_port) {
  std::vector<host_spec> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    std::string_view l = line;
    if (auto hash = l.find('#'); hash != std::string_view::npos)
      l = l.substr(0, hash);
    l = trim(l);
    if (l.empty())
      continue;
    auto where = fmt::format("{}:{}", name, lineno);
    auto space = l.find_first_of(" \t");
    auto endpoint = l.substr(0, space);
    host_spec h;
    h.port = default_port;
    auto ep = split_on(endpoint, ':');
    if (ep.size() > 2)
      throw spec_error(
          fmt::format("{}: invalid host '{}': expected HOST or HOST:PORT", where, endpoint));
    h.host = check_host(ep[0], l);
    if (ep.size() == 2)
      h.port = static_cast<uint16_t>(
          parse_bounded_int(ep[1], 1, 65535, fmt::format("{}: port of '{}'", where, endpoint)));
    if (space != std::string_view::npos) {
      auto rest = trim(l.substr(space));
      auto eq = rest.find('=');
      if (eq == std::string_view::npos || trim(rest.substr(0, eq)) != "slots")
        throw spec_error(fmt::format("{}: expected 'HOST[:PORT] slots=N', got '{}'", where, l));
      h.slots = static_cast<uint32_t>(parse_bounded_int(
          rest.substr(eq + 1), 1, 1 << 20, fmt::format("{}: slots of '{}'", where, h.host)));
    }
    out.push_back(std::move(h));
  }
  if (in.bad())
    throw spec_error(fmt::format("cannot read hostfile {}", name));
  if (out.empty())
    throw spec_error(fmt::format("hostfile {} lists no hosts", name));
  reject_duplicates(out, fmt::format("hostfile {}", name));
  return out;
}

std::vector<host_spec> parse_discovery_output(std::string_view text,
                                              std::optional<uint32_t> slots_per_host,
                                              uint16_t default_port) {
  std::vector<host_spec> out;
  int lineno = 0;
  for (auto line : split_on(text, '\n')) {
    if (++lineno > 65536)
      throw spec_error("discovery output has more than 65536 lines");
    if (line.size() > 1024)
      throw spec_error(
          fmt::format("discovery output line {} is longer than 1024 characters", lineno));
    if (auto hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    line = trim(line);
    if (line.empty())
      continue;
    try {
      if (line.find(':') == std::string_view::npos) {
        if (!slots_per_host)
          throw spec_error(fmt::format("'{}' gives no slot count; print HOST:SLOTS or pass "
                                       "--slots-per-host",
                                       line));
        out.push_back(host_spec{check_host(line, line), default_port, *slots_per_host});
      } else {
        out.push_back(parse_host_spec(line, default_port));
      }
    } catch (const spec_error& e) {
      throw spec_error(fmt::format("discovery output line {}: {}", lineno, e.what()));
    }
  }
  reject_duplicates(out, "the discovery output");
  return out;
}

} // namespace cafhvd

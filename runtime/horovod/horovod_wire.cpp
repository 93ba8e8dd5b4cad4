// Horovod's worker notification wire (see horovod_wire.hpp): a pickle subset reader for
// registrations and answers, the HostsUpdatedRequest encoder, HMAC framing and a client.
#include "runtime/horovod/horovod_wire.hpp"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <stdexcept>
#include <sys/socket.h>
#include <unistd.h>
#include <unordered_map>

#include <fmt/format.h>

#include "runtime/network/net.hpp"

namespace cafhvd {

namespace {

// ---------------------------------------------------------------------------------------
// Pickle opcodes (Python's Lib/pickle.py; pickletools documents each).

enum op : uint8_t {
  MARK = '(',
  STOP = '.',
  BININT = 'J',
  BININT1 = 'K',
  BININT2 = 'M',
  REDUCE = 'R',
  BINUNICODE = 'X',
  APPEND = 'a',
  BUILD = 'b',
  GLOBAL = 'c',
  APPENDS = 'e',
  BINGET = 'h',
  LONG_BINGET = 'j',
  EMPTY_LIST = ']',
  BINPUT = 'q',
  LONG_BINPUT = 'r',
  SETITEM = 's',
  TUPLE = 't',
  EMPTY_TUPLE = ')',
  SETITEMS = 'u',
  EMPTY_DICT = '}',
  BINBYTES = 'B',
  SHORT_BINBYTES = 'C',
  PROTO = 0x80,
  NEWOBJ = 0x81,
  TUPLE1 = 0x85,
  TUPLE2 = 0x86,
  TUPLE3 = 0x87,
  LONG1 = 0x8a,
  SHORT_BINUNICODE = 0x8c,
  BINUNICODE8 = 0x8d,
  BINBYTES8 = 0x8e,
  STACK_GLOBAL = 0x93,
  MEMOIZE = 0x94,
  FRAME = 0x95,
};

// Every opcode of protocols 0-5, so that a refusal names what it refused.
const char* opcode_name(uint8_t c) {
  switch (c) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

std::string describe_opcode(uint8_t c) {
  if (const char* name = opcode_name(c))
    return fmt::format("{} (0x{:02x})", name, c);
  return fmt::format("unknown opcode 0x{:02x}", c);
}

// Text from the input, made safe for a log line.
std::string printable(std::string_view s, size_t max = 80) {
  std::string out;
  for (char c : s.substr(0, max))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max)
    out += "...";
  return out;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1fu;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0fu;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07u;
    } else {
      return false;
    }
    if (s.size() - i <= n)
      return false;
    for (size_t k = 1; k <= n; ++k) {
      auto cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80)
        return false;
      cp = (cp << 6) | (cc & 0x3fu);
    }
    static constexpr uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < smallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// The pickle subset reader. Values live in an arena and the stack and memo hold indexes,
// so that BINGET shares a value as Python does (a memoized list filled later is the same
// list). Nothing here is ever called, imported or looked up: a class is only its name.

struct refusal {
  std::string why;
};

struct pk_value {
  enum class kind : uint8_t { str, bytes, integer, list, tuple, dict, global, instance };
  kind k = kind::integer;
  std::string text;          // str / bytes contents; global: module
  std::string name;          // global: qualified name
  int64_t number = 0;        // integer
  std::vector<size_t> items; // list / tuple elements; dict: key, value, key, value...;
                             // instance: its class
};

const char* kind_name(pk_value::kind k) {
  switch (k) {
    case pk_value::kind::str: return "str";
    case pk_value::kind::bytes: return "bytes";
    case pk_value::kind::integer: return "int";
    case pk_value::kind::list: return "list";
    case pk_value::kind::tuple: return "tuple";
    case pk_value::kind::dict: return "dict";
    case pk_value::kind::global: return "global";
    case pk_value::kind::instance: return "object";
  }
  return "?";
}

struct pk_policy {
  // GLOBAL / STACK_GLOBAL make a class name, EMPTY_TUPLE + NEWOBJ an object of it with
  // no state (how a stateless class such as AckResponse is pickled).
  // A registration never has either: no globals and no calls (Horovod sends protocol 5;
  // protocol 2, which writes bytes as a call of _codecs.encode, is refused).
  bool class_refs = false;
};

class pk_reader {
public:
  using L = registration_limits;

  pk_reader(std::string_view in, pk_policy policy) : in_(in), policy_(policy) {}

  // Runs to STOP; returns the index of the result.
  size_t run() {
    if (in_.empty())
      throw refusal{"the pickle is empty"};
    if (static_cast<uint8_t>(in_[0]) != PROTO)
      throw refusal{fmt::format("a pickle of protocol 2 or later starts with PROTO (0x80), "
                                "this one with {}",
                                describe_opcode(static_cast<uint8_t>(in_[0])))};
    for (;;) {
      if (pos_ >= in_.size())
        throw refusal{fmt::format("the pickle ends at offset {} before STOP", pos_)};
      at_ = pos_;
      code_ = static_cast<uint8_t>(in_[pos_++]);
      if (step())
        break;
    }
    return result_;
  }

  const pk_value& at(size_t i) const { return values_[i]; }

private:
  [[noreturn]] void fail(std::string what) const {
    throw refusal{fmt::format("{} at offset {}: {}", describe_opcode(code_), at_, what)};
  }
  [[noreturn]] void refuse_opcode(std::string_view extra = {}) const {
    throw refusal{fmt::format("{} at offset {} is not allowed in this pickle{}",
                              describe_opcode(code_), at_, extra)};
  }

  uint64_t le(size_t n) {
    if (in_.size() - pos_ < n)
      fail(fmt::format("{} bytes of argument needed, {} left", n, in_.size() - pos_));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= uint64_t{static_cast<uint8_t>(in_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }

  std::string_view take(uint64_t n, size_t cap) {
    if (n > cap)
      fail(fmt::format("a string of {} bytes (at most {})", n, cap));
    if (in_.size() - pos_ < n)
      fail(fmt::format("a string of {} bytes, {} left", n, in_.size() - pos_));
    auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }

  std::string_view line() {
    auto end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256)
      fail("expected a name of at most 256 characters ending in a newline");
    auto s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  size_t make(pk_value v) {
    values_.push_back(std::move(v));
    return values_.size() - 1;
  }
  void push(size_t v) {
    if (stack_.size() >= L::max_stack)
      fail(fmt::format("more than {} values on the stack", L::max_stack));
    stack_.push_back(v);
  }
  size_t base() const { return marks_.empty() ? 0 : marks_.back(); }
  void need(size_t n) const {
    if (stack_.size() - base() < n)
      fail(fmt::format("needs {} value(s) on the stack above the last MARK, has {}", n,
                       stack_.size() - base()));
  }
  size_t pop() {
    need(1);
    auto v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t top() const {
    need(1);
    return stack_.back();
  }
  // Pops the last MARK; returns where its items start. The value below them, if the
  // opcode needs one, must lie above the MARK before it.
  size_t pop_mark(bool needs_target) {
    if (marks_.empty())
      fail("no MARK to close");
    auto from = marks_.back();
    marks_.pop_back();
    if (needs_target && from <= base())
      fail("nothing below the MARK to add the items to");
    return from;
  }
  pk_value& expect(size_t i, pk_value::kind k, std::string_view role) {
    if (values_[i].k != k)
      fail(fmt::format("{} must be a {}, is a {}", role, kind_name(k), kind_name(values_[i].k)));
    return values_[i];
  }

  size_t string_value(std::string_view s, pk_value::kind k) {
    if (k == pk_value::kind::str && !valid_utf8(s))
      fail("a str that is not valid UTF-8");
    pk_value v;
    v.k = k;
    v.text = s;
    return make(std::move(v));
  }
  size_t integer(int64_t n) {
    pk_value v;
    v.number = n;
    return make(std::move(v));
  }
  size_t global(std::string_view module, std::string_view name) {
    if (!policy_.class_refs)
      refuse_opcode(fmt::format(" (it names {}.{})", printable(module), printable(name)));
    pk_value v;
    v.k = pk_value::kind::global;
    v.text = module;
    v.name = name;
    return make(std::move(v));
  }
  void memo_put(uint64_t index) {
    auto v = top();
    if (memo_.size() >= L::max_memo && !memo_.count(index))
      fail(fmt::format("more than {} memo entries", L::max_memo));
    memo_[index] = v;
  }
  void memo_get(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end())
      fail(fmt::format("memo entry {} was never stored", index));
    push(it->second);
  }
  void tuple_of(size_t from) {
    pk_value t;
    t.k = pk_value::kind::tuple;
    t.items.assign(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    push(make(std::move(t)));
  }


  // One opcode; true at STOP.
  bool step() {
    using K = pk_value::kind;
    switch (code_) {
      case PROTO: {
        auto v = le(1);
        if (at_ != 0)
          fail("PROTO is only allowed at offset 0");
        if (v < 2 || v > 5)
          fail(fmt::format("protocol {} (2 to 5 are read)", v));
        return false;
      }
      case FRAME: {
        auto n = le(8);
        if (n > in_.size() - pos_)
          fail(fmt::format("a frame of {} bytes, {} left", n, in_.size() - pos_));
        return false;
      }
      case MARK:
        if (marks_.size() >= L::max_marks)
          fail(fmt::format("more than {} open MARKs", L::max_marks));
        marks_.push_back(stack_.size());
        return false;
      case EMPTY_DICT: push(make(pk_value{K::dict, {}, {}, 0, {}})); return false;
      case EMPTY_LIST: push(make(pk_value{K::list, {}, {}, 0, {}})); return false;
      case EMPTY_TUPLE: push(make(pk_value{K::tuple, {}, {}, 0, {}})); return false;
      case TUPLE1:
      case TUPLE2:
      case TUPLE3: {
        size_t n = code_ - TUPLE1 + 1u;
        need(n);
        tuple_of(stack_.size() - n);
        return false;
      }
      case TUPLE: {
        auto from = pop_mark(false);
        tuple_of(from);
        return false;
      }
      case APPEND: {
        need(2);
        auto v = pop();
        expect(top(), K::list, "APPEND's target").items.push_back(v);
        return false;
      }
      case APPENDS: {
        auto from = pop_mark(true);
        auto& list = expect(stack_[from - 1], K::list, "APPENDS' target");
        list.items.insert(list.items.end(), stack_.begin() + static_cast<std::ptrdiff_t>(from),
                          stack_.end());
        stack_.resize(from);
        return false;
      }
      case SETITEM: {
        need(3);
        auto value = pop();
        auto key = pop();
        auto& dict = expect(top(), K::dict, "SETITEM's target");
        dict.items.push_back(key);
        dict.items.push_back(value);
        return false;
      }
      case SETITEMS: {
        auto from = pop_mark(true);
        if ((stack_.size() - from) % 2 != 0)
          fail("an odd number of items (keys and values come in pairs)");
        auto& dict = expect(stack_[from - 1], K::dict, "SETITEMS' target");
        dict.items.insert(dict.items.end(), stack_.begin() + static_cast<std::ptrdiff_t>(from),
                          stack_.end());
        stack_.resize(from);
        return false;
      }
      case SHORT_BINUNICODE: push(string_value(take(le(1), L::max_string), K::str)); return false;
      case BINUNICODE: push(string_value(take(le(4), L::max_string), K::str)); return false;
      case BINUNICODE8: push(string_value(take(le(8), L::max_string), K::str)); return false;
      case SHORT_BINBYTES: push(string_value(take(le(1), L::max_string), K::bytes)); return false;
      case BINBYTES: push(string_value(take(le(4), L::max_string), K::bytes)); return false;
      case BINBYTES8: push(string_value(take(le(8), L::max_string), K::bytes)); return false;
      case BININT1: push(integer(static_cast<int64_t>(le(1)))); return false;
      case BININT2: push(integer(static_cast<int64_t>(le(2)))); return false;
      case BININT: push(integer(static_cast<int32_t>(static_cast<uint32_t>(le(4))))); return false;
      case LONG1: {
        auto n = le(1);
        if (n > 8)
          fail(fmt::format("an integer of {} bytes (at most 8 are read)", n));
        auto raw = le(n);
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) // negative: extend the sign
          raw |= ~uint64_t{0} << (8 * n);
        push(integer(static_cast<int64_t>(raw)));
        return false;
      }
      case MEMOIZE: memo_put(memo_.size()); return false;
      case BINPUT: memo_put(le(1)); return false;
      case LONG_BINPUT: memo_put(le(4)); return false;
      case BINGET: memo_get(le(1)); return false;
      case LONG_BINGET: memo_get(le(4)); return false;
      case GLOBAL: {
        auto module = line();
        auto name = line();
        push(global(module, name));
        return false;
      }
      case STACK_GLOBAL: {
        if (!policy_.class_refs) {
          // Name what it would have looked up, if the names are there.
          if (stack_.size() - base() >= 2 && values_[stack_.back()].k == K::str
              && values_[stack_[stack_.size() - 2]].k == K::str)
            refuse_opcode(fmt::format(" (it names {}.{})",
                                      printable(values_[stack_[stack_.size() - 2]].text),
                                      printable(values_[stack_.back()].text)));
          refuse_opcode();
        }
        need(2);
        auto name = pop();
        auto module = pop();
        expect(name, K::str, "STACK_GLOBAL's name");
        expect(module, K::str, "STACK_GLOBAL's module");
        push(global(values_[module].text, values_[name].text));
        return false;
      }
      case NEWOBJ: {
        if (!policy_.class_refs)
          refuse_opcode();
        need(2);
        auto args = pop();
        auto cls = pop();
        expect(cls, K::global, "NEWOBJ's class");
        if (values_[args].k != K::tuple || !values_[args].items.empty())
          fail("NEWOBJ with arguments (only classes built from no arguments are read)");
        pk_value v;
        v.k = K::instance;
        v.items.push_back(cls);
        push(make(std::move(v)));
        return false;
      }
      case STOP: {
        result_ = pop();
        if (!stack_.empty() || !marks_.empty())
          fail(fmt::format("{} value(s) and {} MARK(s) left over", stack_.size(), marks_.size()));
        if (pos_ != in_.size())
          fail(fmt::format("{} bytes after STOP", in_.size() - pos_));
        return true;
      }
      default: refuse_opcode();
    }
  }

  std::string_view in_;
  pk_policy policy_;
  size_t pos_ = 0;
  size_t at_ = 0;     // offset of the opcode being run
  uint8_t code_ = 0;  // the opcode being run
  size_t result_ = 0; // STOP's value
  std::vector<pk_value> values_;
  std::vector<size_t> stack_;
  std::vector<size_t> marks_; // stack sizes at each open MARK
  std::unordered_map<uint64_t, size_t> memo_;
};

// ---------------------------------------------------------------------------------------
// Registration shape: ({str: [(str, int), ...]}, bytes)

bool is_ip(const std::string& s) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, s.c_str(), buf) == 1 || ::inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

worker_registration registration_from(const pk_reader& r, size_t root) {
  using K = pk_value::kind;
  using L = registration_limits;
  auto shape = [](std::string what) {
    return refusal{"the registration is not ({interface: [(ip, port), ...]}, key): " + what};
  };
  const auto& top = r.at(root);
  if (top.k != K::tuple || top.items.size() != 2)
    throw shape(fmt::format("got a {} of {} item(s)", kind_name(top.k), top.items.size()));
  const auto& dict = r.at(top.items[0]);
  const auto& key = r.at(top.items[1]);
  if (dict.k != K::dict)
    throw shape(fmt::format("the first item is a {}", kind_name(dict.k)));
  if (key.k != K::bytes)
    throw shape(fmt::format("the key is a {}, not bytes", kind_name(key.k)));
  if (key.text.empty() || key.text.size() > L::max_key)
    throw refusal{
        fmt::format("the key has {} bytes (1 to {} are accepted)", key.text.size(), L::max_key)};
  if (dict.items.size() / 2 > L::max_interfaces)
    throw refusal{
        fmt::format("{} interfaces (at most {})", dict.items.size() / 2, L::max_interfaces)};
  worker_registration out;
  size_t total = 0;
  for (size_t i = 0; i + 1 < dict.items.size(); i += 2) {
    const auto& name = r.at(dict.items[i]);
    const auto& list = r.at(dict.items[i + 1]);
    if (name.k != K::str)
      throw shape(fmt::format("an interface name is a {}", kind_name(name.k)));
    if (name.text.empty() || name.text.size() > L::max_interface_name)
      throw refusal{fmt::format("an interface name of {} bytes (1 to {})", name.text.size(),
                                L::max_interface_name)};
    for (char c : name.text)
      if (static_cast<uint8_t>(c) < 0x20 || c == 0x7f)
        throw refusal{fmt::format("interface '{}' has a control character in its name",
                                  printable(name.text))};
    for (const auto& [seen, _] : out.addresses)
      if (seen == name.text)
        throw refusal{fmt::format("interface '{}' appears twice", printable(name.text))};
    if (list.k != K::list)
      throw shape(fmt::format("interface '{}' has a {}, not a list", printable(name.text),
                              kind_name(list.k)));
    total += list.items.size();
    if (total > L::max_addresses)
      throw refusal{fmt::format("more than {} addresses", L::max_addresses)};
    std::vector<std::pair<std::string, uint16_t>> addrs;
    for (auto a : list.items) {
      const auto& pair = r.at(a);
      if (pair.k != K::tuple || pair.items.size() != 2)
        throw shape(fmt::format("an address of '{}' is a {} of {} item(s), not (ip, port)",
                                printable(name.text), kind_name(pair.k), pair.items.size()));
      const auto& ip = r.at(pair.items[0]);
      const auto& port = r.at(pair.items[1]);
      if (ip.k != K::str || port.k != K::integer)
        throw shape(fmt::format("an address of '{}' is ({}, {}), not (str, int)",
                                printable(name.text), kind_name(ip.k), kind_name(port.k)));
      if (ip.text.size() > 64 || !is_ip(ip.text))
        throw refusal{fmt::format("interface '{}': '{}' is not an IPv4 or IPv6 address",
                                  printable(name.text), printable(ip.text))};
      if (port.number < 1 || port.number > 65535)
        throw refusal{fmt::format("interface '{}': port {} of {} is not within 1-65535",
                                  printable(name.text), port.number, ip.text)};
      addrs.emplace_back(ip.text, static_cast<uint16_t>(port.number));
    }
    out.addresses.emplace_back(name.text, std::move(addrs));
  }
  if (total == 0)
    throw refusal{"the registration has no address"};
  out.key = key.text;
  return out;
}

int base64_digit(char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+')
    return 62;
  if (c == '/')
    return 63;
  return -1;
}

// Standard alphabet with padding, as Python's base64.b64encode writes it; nothing else.
std::optional<std::string> base64_decode(std::string_view in, std::string& error) {
  if (in.size() % 4 != 0) {
    error =
        fmt::format("the body is not base64: {} characters (a multiple of 4 expected)", in.size());
    return std::nullopt;
  }
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    size_t pad = 0;
    if (i + 4 == in.size() && in[i + 3] == '=')
      pad = in[i + 2] == '=' ? 2 : 1;
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      int d = k < 4 - pad ? base64_digit(in[i + k]) : 0;
      if (d < 0) {
        auto c = static_cast<uint8_t>(in[i + k]);
        error = fmt::format("the body is not base64: {} at offset {}",
                            (c >= 0x20 && c < 0x7f) ? fmt::format("'{}'", static_cast<char>(c))
                                                    : fmt::format("byte 0x{:02x}", c),
                            i + k);
        return std::nullopt;
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2)
      out += static_cast<char>((v >> 8) & 0xff);
    if (pad < 1)
      out += static_cast<char>(v & 0xff);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Writing pickles.

void put_le(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void short_str(std::string& out, std::string_view s) { // SHORT_BINUNICODE + MEMOIZE
  out += static_cast<char>(SHORT_BINUNICODE);
  out += static_cast<char>(s.size());
  out += s;
  out += static_cast<char>(MEMOIZE);
}

// As Python's save_long chooses: BININT1, BININT2, BININT, else LONG1 with the fewest
// two's complement bytes.
void pickle_int(std::string& out, int64_t v) {
  if (v >= 0 && v <= 0xff) {
    out += static_cast<char>(BININT1);
    put_le(out, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v <= 0xffff) {
    out += static_cast<char>(BININT2);
    put_le(out, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out += static_cast<char>(BININT);
    put_le(out, static_cast<uint64_t>(v), 4);
  } else {
    size_t n = 1;
    while (n < 8) {
      int64_t lo = -(int64_t{1} << (8 * n - 1));
      int64_t hi = (int64_t{1} << (8 * n - 1)) - 1;
      if (v >= lo && v <= hi)
        break;
      ++n;
    }
    out += static_cast<char>(LONG1);
    out += static_cast<char>(n);
    put_le(out, static_cast<uint64_t>(v), n);
  }
}

// HMAC-SHA256 with OpenSSL, in the network module (runtime/network/net.hpp).
std::string digest_of(std::string_view key, std::string_view body) {
  return net::module().hmac_sha256(key, body);
}

constexpr size_t digest_size = 32;

// ---------------------------------------------------------------------------------------
// The client's socket work, one address at a time.

struct fd_closer {
  int fd;
  ~fd_closer() {
    if (fd >= 0)
      ::close(fd);
  }
};

using steady = std::chrono::steady_clock;

int ms_left(steady::time_point until) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(until - steady::now()).count();
  return left <= 0 ? 0 : left > INT32_MAX ? INT32_MAX : static_cast<int>(left);
}

// Waits for `events`; false when the deadline passed first.
bool wait_for(int fd, short events, steady::time_point until) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms_left(until));
    if (n > 0)
      return true;
    if (n == 0)
      return false;
    if (errno != EINTR)
      return true; // let the next call report the error
  }
}

notify_attempt::outcome connect_outcome(int err) {
  using O = notify_attempt::outcome;
  switch (err) {
    case ECONNREFUSED: return O::refused;
    case ETIMEDOUT: return O::timed_out;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case EADDRNOTAVAIL:
    case EAFNOSUPPORT: return O::unreachable;
    default: return O::io_error;
  }
}

void try_address(notify_attempt& a, const std::string& ip, uint16_t port, const std::string& key,
                 const std::string& request, std::chrono::milliseconds deadline) {
  using O = notify_attempt::outcome;
  auto until = steady::now() + deadline;
  sockaddr_storage ss{};
  socklen_t len = 0;
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, ip.c_str(), &v4) == 1) {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
    a4->sin_family = AF_INET;
    a4->sin_addr = v4;
    a4->sin_port = htons(port);
    len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, ip.c_str(), &v6) == 1) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = v6;
    a6->sin6_port = htons(port);
    len = sizeof(sockaddr_in6);
  } else {
    a.what = O::bad_address;
    a.detail = "not an IPv4 or IPv6 address";
    return;
  }
  fd_closer s{::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) {
    a.what = connect_outcome(errno);
    a.detail = fmt::format("socket: {}", std::strerror(errno));
    return;
  }
  auto failed = [&](O what, std::string detail) {
    a.what = what;
    a.detail = std::move(detail);
  };
  auto ms = deadline.count();
  if (::connect(s.fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    if (errno != EINPROGRESS)
      return failed(connect_outcome(errno), fmt::format("connect: {}", std::strerror(errno)));
    if (!wait_for(s.fd, POLLOUT, until))
      return failed(O::timed_out, fmt::format("not connected within {} ms", ms));
    int err = 0;
    socklen_t err_len = sizeof(err);
    if (::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0)
      err = errno;
    if (err != 0)
      return failed(connect_outcome(err), fmt::format("connect: {}", std::strerror(err)));
  }
  for (size_t sent = 0; sent < request.size();) {
    auto n = ::send(s.fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      auto what = (errno == EPIPE || errno == ECONNRESET) ? O::closed : O::io_error;
      return failed(what, fmt::format("sending the request: {}", std::strerror(errno)));
    }
    if (!wait_for(s.fd, POLLOUT, until))
      return failed(O::timed_out, fmt::format("request not sent within {} ms ({} of {} bytes)", ms,
                                              sent, request.size()));
  }
  std::string answer;
  char buf[4096];
  for (;;) {
    if (!wait_for(s.fd, POLLIN, until))
      return failed(O::timed_out,
                    fmt::format("no answer within {} ms ({} bytes came)", ms, answer.size()));
    auto n = ::recv(s.fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (n < 0 && errno != ECONNRESET)
      return failed(O::io_error, fmt::format("reading the answer: {}", std::strerror(errno)));
    if (n <= 0) {
      if (answer.empty())
        return failed(O::closed, "closed the connection without answering (what a Horovod "
                                 "worker does when it refuses our key)");
      return failed(O::closed, fmt::format("closed the connection after {} bytes of an answer",
                                           answer.size()));
    }
    answer.append(buf, static_cast<size_t>(n));
    auto f = parse_framed_message(key, answer);
    switch (f.what) {
      case parsed_frame::status::incomplete: continue;
      case parsed_frame::status::bad_length:
        return failed(O::unexpected_answer, "an answer whose length field is negative or over "
                                            "64 KiB");
      case parsed_frame::status::bad_digest:
        return failed(O::digest_mismatch,
                      "answered with a digest that does not match the worker's key (not the "
                      "worker that registered, or it refused our key)");
      case parsed_frame::status::complete:
        if (auto why = check_ack_response(f.body); !why.empty())
          return failed(O::unexpected_answer, "answered " + why);
        a.what = O::acknowledged;
        a.detail.clear();
        return;
    }
  }
}

} // namespace

// ---------------------------------------------------------------------------------------

std::string to_string(const worker_registration& r) {
  std::string out;
  for (const auto& [iface, addrs] : r.addresses)
    for (const auto& [ip, port] : addrs) {
      if (!out.empty())
        out += ", ";
      out += ip.find(':') == std::string::npos ? fmt::format("{}: {}:{}", iface, ip, port)
                                               : fmt::format("{}: [{}]:{}", iface, ip, port);
    }
  return (out.empty() ? "no address" : out) + fmt::format(" (key: {} bytes)", r.key.size());
}

decoded_registration decode_worker_registration_pickle(std::string_view pickle) noexcept {
  try {
    if (pickle.size() > registration_limits::max_pickle)
      return {std::nullopt, fmt::format("the registration pickle has {} bytes (at most {})",
                                        pickle.size(), registration_limits::max_pickle)};
    pk_reader r{pickle, pk_policy{false}};
    auto root = r.run();
    return {registration_from(r, root), {}};
  } catch (const refusal& e) {
    return {std::nullopt, e.why};
  } catch (const std::exception& e) {
    return {std::nullopt, fmt::format("the registration could not be read: {}", e.what())};
  }
}

decoded_registration decode_worker_registration(std::string_view body) noexcept {
  try {
    constexpr size_t max_text = (registration_limits::max_pickle + 2) / 3 * 4;
    if (body.size() > max_text)
      return {std::nullopt,
              fmt::format("the body has {} bytes (at most {} of base64)", body.size(), max_text)};
    std::string error;
    auto pickle = base64_decode(body, error);
    if (!pickle)
      return {std::nullopt, error};
    return decode_worker_registration_pickle(*pickle);
  } catch (const std::exception& e) {
    return {std::nullopt, fmt::format("the registration could not be read: {}", e.what())};
  }
}

std::string encode_hosts_updated(int64_t timestamp, unsigned res) {
  static constexpr const char* names[] = {"no_update", "removed", "added", "mixed"};
  if (res > 3)
    throw std::invalid_argument(
        fmt::format("HostUpdateResult {} (no_update=0, removed=1, added=2, mixed=3)", res));
  // cloudpickle.dumps(HostsUpdatedRequest(t, HostUpdateResult.x), protocol=4), memo
  // numbers in comments:
  //   horovod.runner.elastic.worker(0) HostsUpdatedRequest(1) STACK_GLOBAL(2)
  //   EMPTY_TUPLE NEWOBJ(3) EMPTY_DICT(4) MARK 'timestamp'(5) <int> 'res'(6)
  //   builtins(7) getattr(8) STACK_GLOBAL(9) BINGET 0 HostUpdateResult(10)
  //   STACK_GLOBAL(11) '<member>'(12) TUPLE2(13) REDUCE(14) SETITEMS BUILD STOP
  std::string b;
  short_str(b, "horovod.runner.elastic.worker");
  short_str(b, "HostsUpdatedRequest");
  b += static_cast<char>(STACK_GLOBAL);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(EMPTY_TUPLE);
  b += static_cast<char>(NEWOBJ);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(EMPTY_DICT);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(MARK);
  short_str(b, "timestamp");
  pickle_int(b, timestamp);
  short_str(b, "res");
  short_str(b, "builtins");
  short_str(b, "getattr");
  b += static_cast<char>(STACK_GLOBAL);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(BINGET);
  b += '\0'; // the module name, memo 0
  short_str(b, "HostUpdateResult");
  b += static_cast<char>(STACK_GLOBAL);
  b += static_cast<char>(MEMOIZE);
  short_str(b, names[res]);
  b += static_cast<char>(TUPLE2);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(REDUCE);
  b += static_cast<char>(MEMOIZE);
  b += static_cast<char>(SETITEMS);
  b += static_cast<char>(BUILD);
  b += static_cast<char>(STOP);
  std::string out;
  out += static_cast<char>(PROTO);
  out += '\x04';
  out += static_cast<char>(FRAME);
  put_le(out, b.size(), 8);
  return out + b;
}

std::string frame_message(std::string_view key, std::string_view body) {
  if (body.size() > INT32_MAX)
    throw std::length_error(
        fmt::format("a wire message of {} bytes (at most 2^31 - 1)", body.size()));
  std::string out = digest_of(key, body);
  put_le(out, body.size(), 4);
  out += body;
  return out;
}

parsed_frame parse_framed_message(std::string_view key, std::string_view bytes, size_t max_body) {
  parsed_frame f;
  if (bytes.size() < digest_size + 4)
    return f;
  uint32_t raw = 0;
  for (size_t i = 0; i < 4; ++i)
    raw |= uint32_t{static_cast<uint8_t>(bytes[digest_size + i])} << (8 * i);
  auto len = static_cast<int32_t>(raw); // struct 'i': signed
  if (len < 0 || static_cast<size_t>(len) > max_body) {
    f.what = parsed_frame::status::bad_length;
    return f;
  }
  if (bytes.size() - digest_size - 4 < static_cast<size_t>(len))
    return f;
  auto body = bytes.substr(digest_size + 4, static_cast<size_t>(len));
  auto expected = digest_of(key, body);
  if (!net::module().digests_equal(expected, std::string_view(bytes.data(), digest_size))) {
    f.what = parsed_frame::status::bad_digest;
    return f;
  }
  f.what = parsed_frame::status::complete;
  f.body = body;
  f.used = digest_size + 4 + static_cast<size_t>(len);
  return f;
}

std::string check_ack_response(std::string_view body) noexcept {
  try {
    if (body.size() > registration_limits::max_pickle)
      return fmt::format("a pickle of {} bytes, not an AckResponse", body.size());
    pk_reader r{body, pk_policy{true}};
    const auto& v = r.at(r.run());
    if (v.k != pk_value::kind::instance)
      return fmt::format("a {}, not an AckResponse", kind_name(v.k));
    const auto& cls = r.at(v.items[0]);
    if (cls.text != "horovod.runner.common.util.network" || cls.name != "AckResponse")
      return fmt::format("{}.{}, not an AckResponse", printable(cls.text), printable(cls.name));
    return {};
  } catch (const refusal& e) {
    return "something other than an AckResponse: " + e.why;
  } catch (const std::exception& e) {
    return fmt::format("something unreadable: {}", e.what());
  }
}

const char* to_string(notify_attempt::outcome o) {
  using O = notify_attempt::outcome;
  switch (o) {
    case O::acknowledged: return "acknowledged";
    case O::refused: return "connection refused";
    case O::unreachable: return "unreachable";
    case O::timed_out: return "timed out";
    case O::closed: return "closed";
    case O::digest_mismatch: return "digest mismatch";
    case O::unexpected_answer: return "unexpected answer";
    case O::bad_address: return "bad address";
    case O::io_error: return "I/O error";
  }
  return "?";
}

std::string to_string(const notify_result& r) {
  if (r.attempts.empty())
    return "no address to notify";
  std::string out;
  for (const auto& a : r.attempts) {
    if (!out.empty())
      out += "; ";
    if (a.address.empty()) { // nothing was sent
      out += a.detail;
      continue;
    }
    out += fmt::format("{} {}: {}", a.interface, a.address, to_string(a.what));
    if (!a.detail.empty())
      out += fmt::format(" ({})", a.detail);
  }
  return out;
}

notify_result notify_hosts_updated(const worker_registration& worker, int64_t timestamp,
                                   unsigned res, std::chrono::milliseconds deadline) {
  notify_result out;
  if (res > 3) {
    notify_attempt a;
    a.what = notify_attempt::outcome::io_error;
    a.detail = fmt::format("HostUpdateResult {} is not 0-3; nothing sent", res);
    out.attempts.push_back(std::move(a));
    return out;
  }
  std::string request;
  try {
    request = frame_message(worker.key, encode_hosts_updated(timestamp, res));
  } catch (const std::exception& e) { // the network module (its HMAC) could not be loaded
    notify_attempt a;
    a.what = notify_attempt::outcome::io_error;
    a.detail = fmt::format("nothing sent: {}", e.what());
    out.attempts.push_back(std::move(a));
    return out;
  }
  for (const auto& [iface, addrs] : worker.addresses)
    for (const auto& [ip, port] : addrs) {
      notify_attempt a;
      a.interface = iface;
      a.address = ip.find(':') == std::string::npos ? fmt::format("{}:{}", ip, port)
                                                    : fmt::format("[{}]:{}", ip, port);
      try_address(a, ip, port, worker.key, request, deadline);
      bool ok = a.what == notify_attempt::outcome::acknowledged;
      out.attempts.push_back(std::move(a));
      if (ok) {
        out.ok = true;
        return out;
      }
    }
  return out;
}

} // namespace cafhvd

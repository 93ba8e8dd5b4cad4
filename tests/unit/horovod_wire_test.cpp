// Horovod's worker notification wire (runtime/horovod/horovod_wire): registrations as horovod
// 0.28.1's workers PUT them, the HostsUpdatedRequest pickle byte for byte, HMAC framing,
// and the client against in-test workers.
//
// Fixtures come from /usr/bin/python3 (3.11, Debian's cloudpickle 2.2.0) with horovod
// 0.28.1 on PYTHONPATH (PY below stands for that: PYTHONPATH=<horovod site>
// /usr/bin/python3), and
//   KEY = bytes.fromhex('5f0e9c2a71d4b83e06a5c7f19b2d4e60837a1cf5e92b4d08c6f3a15e7b9d2c41')
//   TWO = ({'lo': [('127.0.0.1', 45678)], 'eth0': [('172.17.0.2', 45678)]}, KEY)
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <atomic>
#include <chrono>
#include <functional>
#include <netinet/in.h>
#include <poll.h>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "runtime/horovod/horovod_wire.hpp"

using namespace cafhvd;

namespace {

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16));
  return out;
}

const std::string key = unhex("5f0e9c2a71d4b83e06a5c7f19b2d4e60837a1cf5e92b4d08c6f3a15e7b9d2c41");

// PY -c "from horovod.runner.common.util import codec; print(codec.dumps_base64(TWO))"
// (what put_data_into_kvstore sends: cloudpickle at HIGHEST_PROTOCOL = 5, base64)
const char* const two_codec =
    "gAWVXwAAAAAAAAB9lCiMAmxvlF2UjAkxMjcuMC4wLjGUTW6yhpRhjARldGgwlF2UjAoxNzIuMTcuMC4ylE1usoaUYXVD"
    "IF8OnCpx1Lg+BqXH8ZstTmCDehz16StNCMbzoV57nSxBlIaULg==";

// PY -c "import cloudpickle, base64; print(base64.b64encode(cloudpickle.dumps(TWO,
//        protocol=P)).decode())"  for P = 2, 3, 4
// Protocol 2 has no bytes opcode: the key is _codecs.encode('<latin-1 text>', 'latin1'),
// a call, which a registration may not contain.
const char* const two_p2 =
    "gAJ9cQAoWAIAAABsb3EBXXECWAkAAAAxMjcuMC4wLjFxA01usoZxBGFYBAAAAGV0aDBxBV1xBlgKAAAAMTcyLjE3LjAu"
    "MnEHTW6yhnEIYXVjX2NvZGVjcwplbmNvZGUKcQlYLgAAAF8OwpwqccOUwrg+BsKlw4fDscKbLU5gwoN6HMO1w6krTQjD"
    "hsOzwqFee8KdLEFxClgGAAAAbGF0aW4xcQuGcQxScQ2GcQ4u";
const char* const two_p3 =
    "gAN9cQAoWAIAAABsb3EBXXECWAkAAAAxMjcuMC4wLjFxA01usoZxBGFYBAAAAGV0aDBxBV1xBlgKAAAAMTcyLjE3LjAu"
    "MnEHTW6yhnEIYXVDIF8OnCpx1Lg+BqXH8ZstTmCDehz16StNCMbzoV57nSxBcQmGcQou";
const char* const two_p4 =
    "gASVXwAAAAAAAAB9lCiMAmxvlF2UjAkxMjcuMC4wLjGUTW6yhpRhjARldGgwlF2UjAoxNzIuMTcuMC4ylE1usoaUYXVD"
    "IF8OnCpx1Lg+BqXH8ZstTmCDehz16StNCMbzoV57nSxBlIaULg==";

// The body horovod's WorkerNotificationManager.init PUT to /worker_addresses/hostA:0 on a
// test HTTP server (the key is the worker's random one:
// ac5ec027f8d62718588a9bffd6006aa3e7d3ec5798df5b8c265062d66f2140bc).
const char* const captured_put =
    "gAWVXgAAAAAAAAB9lCiMAmxvlF2UjAkxMjcuMC4wLjGUTZ9WhpRhjARldGgwlF2UjAkxOTIuMC4yLjKUTZ9WhpRhdUMg"
    "rF7AJ/jWJxhYipv/1gBqo+fT7FeY31uMJlBi1m8hQLyUhpQu";

// cloudpickle.dumps(({'a': l, 'b': l}, KEY), protocol=5) with
// l = [('10.0.0.1', 1234), ('fe80::1', 1234)]: the second list is a BINGET of the first.
const char* const shared_list =
    "gAWVVwAAAAAAAAB9lCiMAWGUXZQojAgxMC4wLjAuMZRN0gSGlIwHZmU4MDo6MZRN0gSGlGWMAWKUaAJ1QyBfDpwqcdS4"
    "Pgalx/GbLU5gg3oc9ekrTQjG86Fee50sQZSGlC4=";

// cloudpickle.dumps(({'eth0': [('10.1.2.3', 80)]}, KEY), protocol=5): one item, so
// SETITEM and APPEND without MARK, and the port as BININT1.
const char* const one_iface =
    "gAWVQgAAAAAAAAB9lIwEZXRoMJRdlIwIMTAuMS4yLjOUS1CGlGFzQyBfDpwqcdS4Pgalx/GbLU5gg3oc9ekrTQjG86Fe"
    "e50sQZSGlC4=";

// cloudpickle.dumps(({'eth0': [('10.0.0.1', 1234)]}, E()), protocol=5) where
// class E: def __reduce__(self): return (os.system, ('id',))
const char* const system_in_registration =
    "gAWVPAAAAAAAAAB9lIwEZXRoMJRdlIwIMTAuMC4wLjGUTdIEhpRhc4wFcG9zaXiU"
    "jAZzeXN0ZW2Uk5SMAmlklIWUUpSGlC4=";

// The same E() alone: pickle.dumps(E(), protocol=2).hex() and protocol=5.
const char* const system_p2 =
    "800263706f7369780a73797374656d0a71005802000000696471018571025271032e";
const char* const system_p5 =
    "8005951d000000000000008c05706f736978948c0673797374656d9493948c02696494859452942e";

// PY -c "from horovod.runner.common.util import network; import cloudpickle, pickle;
//        print(cloudpickle.dumps(network.AckResponse(), protocol=P).hex())"
//   P = pickle.HIGHEST_PROTOCOL (5), and 2
const char* const ack_p5 = "80059539000000000000008c22686f726f766f642e72756e6e65722e636f6d6d6f6e"
                           "2e7574696c2e6e6574776f726b948c0b41636b526573706f6e73659493942981942e";
const char* const ack_p2 = "800263686f726f766f642e72756e6e65722e636f6d6d6f6e2e7574696c2e6e6574776f"
                           "726b0a41636b526573706f6e73650a7100298171012e";
// network.Wire(KEY).write(network.AckResponse(), buf): what the worker's service sends.
const char* const wire_ack =
    "0b81980997d4a9dd015ba81caabe475c0bbd5f540b22b45127c45bfecce3030e44000000"
    "80059539000000000000008c22686f726f766f642e72756e6e65722e636f6d6d6f6e2e7574696c2e6e6574776f"
    "726b948c0b41636b526573706f6e73659493942981942e";
// cloudpickle.dumps(network.PingResponse('worker notification service', '127.0.0.1'),
//                   protocol=5).hex()
const char* const ping_p5 =
    "80059589000000000000008c22686f726f766f642e72756e6e65722e636f6d6d6f6e2e7574696c2e6e6574776f"
    "726b948c0c50696e67526573706f6e73659493942981947d94288c0c736572766963655f6e616d65948c1b776f72"
    "6b6572206e6f74696669636174696f6e2073657276696365948c0e736f757263655f61646472657373948c093132"
    "372e302e302e319475622e";

// PY -c "from horovod.runner.elastic.worker import *; import cloudpickle;
//        print(cloudpickle.dumps(HostsUpdatedRequest(T, HostUpdateResult.R), protocol=4).hex())"
const char* const hur_prefix = // everything up to the timestamp, after PROTO and FRAME
    "8c1d686f726f766f642e72756e6e65722e656c61737469632e776f726b6572948c13486f737473557064617465"
    "64526571756573749493942981947d94288c0974696d657374616d7094";
const char* const hur_middle = // after the timestamp, up to the member's name
    "8c03726573948c086275696c74696e73948c076765746174747294939468008c10486f73745570646174655265"
    "73756c74949394";
const char* const hur_end = "948694529475622e";
// T = 1700000000: R = removed, added, no_update
const char* const hur_removed =
    "80049594000000000000008c1d686f726f766f642e72756e6e65722e656c61737469632e776f726b6572948c13"
    "486f73747355706461746564526571756573749493942981947d94288c0974696d657374616d70944a00f15365"
    "8c03726573948c086275696c74696e73948c076765746174747294939468008c10486f737455706461746552"
    "6573756c749493948c0772656d6f766564948694529475622e";
const char* const hur_added =
    "80049592000000000000008c1d686f726f766f642e72756e6e65722e656c61737469632e776f726b6572948c13"
    "486f73747355706461746564526571756573749493942981947d94288c0974696d657374616d70944a00f15365"
    "8c03726573948c086275696c74696e73948c076765746174747294939468008c10486f737455706461746552"
    "6573756c749493948c056164646564948694529475622e";
const char* const hur_no_update =
    "80049596000000000000008c1d686f726f766f642e72756e6e65722e656c61737469632e776f726b6572948c13"
    "486f73747355706461746564526571756573749493942981947d94288c0974696d657374616d70944a00f15365"
    "8c03726573948c086275696c74696e73948c076765746174747294939468008c10486f737455706461746552"
    "6573756c749493948c096e6f5f757064617465948694529475622e";
// Python 3.11 pickles the alias `mixed` as _operator.or_(added, removed). We write
// getattr(HostUpdateResult, 'mixed') like the other members; these bytes are that, from a
// cloudpickle.Pickler subclass whose reducer_override returns
// (getattr, (HostUpdateResult, obj.name)); pickle.loads gives HostUpdateResult.mixed.
const char* const hur_mixed =
    "80049592000000000000008c1d686f726f766f642e72756e6e65722e656c61737469632e776f726b6572948c13"
    "486f73747355706461746564526571756573749493942981947d94288c0974696d657374616d70944a00f15365"
    "8c03726573948c086275696c74696e73948c076765746174747294939468008c10486f737455706461746552"
    "6573756c749493948c056d69786564948694529475622e";

// A pickle written by hand, opcode by opcode.
struct pk {
  std::string b = std::string("\x80\x04", 2);
  pk& op(int c) {
    b += static_cast<char>(c);
    return *this;
  }
  pk& raw(std::string_view s) {
    b += s;
    return *this;
  }
  pk& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i)
      b += static_cast<char>((v >> (8 * i)) & 0xff);
    return *this;
  }
  pk& str(std::string_view s) { return op(0x8c).le(s.size(), 1).raw(s); }
  pk& bytes(std::string_view s) { return op('B').le(s.size(), 4).raw(s); }
  pk& i32(int64_t v) { return op('J').le(static_cast<uint64_t>(v), 4); }
  std::string stop() { return b + '.'; }
};

// ({iface: [(ip, port)]}, key) by hand; `key_op` lets a test swap in another value.
std::string registration(std::string_view iface, std::string_view ip, int64_t port,
                         const std::function<void(pk&)>& key_op) {
  pk p;
  p.op('}').str(iface).op(']').str(ip).i32(port).op(0x86).op('a').op('s');
  key_op(p);
  return p.op(0x86).stop();
}
std::string registration(std::string_view iface, std::string_view ip, int64_t port) {
  return registration(iface, ip, port, [](pk& p) { p.bytes(key); });
}

std::string refusal(std::string_view pickle) {
  auto d = decode_worker_registration_pickle(pickle);
  CHECK_FALSE(d.value);
  return d.error;
}

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("horovod wire: registrations from cloudpickle at protocols 3 to 5") {
  for (const char* body : {two_codec, two_p3, two_p4}) {
    CAPTURE(body);
    auto d = decode_worker_registration(body);
    REQUIRE_MESSAGE(d.value, d.error);
    REQUIRE(d.value->addresses.size() == 2);
    CHECK(d.value->addresses[0].first == "lo");
    CHECK(d.value->addresses[0].second
          == std::vector<std::pair<std::string, uint16_t>>{{"127.0.0.1", 45678}});
    CHECK(d.value->addresses[1].first == "eth0");
    CHECK(d.value->addresses[1].second
          == std::vector<std::pair<std::string, uint16_t>>{{"172.17.0.2", 45678}});
    CHECK(d.value->key == key);
    CHECK(to_string(*d.value) == "lo: 127.0.0.1:45678, eth0: 172.17.0.2:45678 (key: 32 bytes)");
  }
}

TEST_CASE("horovod wire: the body a real worker PUT, shared lists, one interface") {
  auto put = decode_worker_registration(captured_put);
  REQUIRE_MESSAGE(put.value, put.error);
  CHECK(to_string(*put.value) == "lo: 127.0.0.1:22175, eth0: 192.0.2.2:22175 (key: 32 bytes)");
  CHECK(put.value->key
        == unhex("ac5ec027f8d62718588a9bffd6006aa3e7d3ec5798df5b8c265062d66f2140bc"));

  auto shared = decode_worker_registration(shared_list);
  REQUIRE_MESSAGE(shared.value, shared.error);
  std::vector<std::pair<std::string, uint16_t>> l{{"10.0.0.1", 1234}, {"fe80::1", 1234}};
  REQUIRE(shared.value->addresses.size() == 2);
  CHECK(shared.value->addresses[0].second == l);
  CHECK(shared.value->addresses[1].second == l);
  CHECK(to_string(*shared.value)
        == "a: 10.0.0.1:1234, a: [fe80::1]:1234, b: 10.0.0.1:1234, b: [fe80::1]:1234 (key: 32 "
           "bytes)");

  auto one = decode_worker_registration(one_iface);
  REQUIRE_MESSAGE(one.value, one.error);
  CHECK(to_string(*one.value) == "eth0: 10.1.2.3:80 (key: 32 bytes)");
}

TEST_CASE("horovod wire: the rarer opcodes of the subset") {
  // LONG1 port, BINUNICODE8 / BINBYTES8, LONG_BINPUT / LONG_BINGET, MARK + TUPLE, BININT2.
  pk q;
  q.op('}').op(0x8d).le(5, 8).raw("ib0\xc3\xa9").op(']');
  q.op('(').op('X').le(8, 4).raw("::ffff:1").op(0x8a).le(2, 1).le(443, 2).op('t');
  q.op('r').le(70000, 4).op('a').op('s');
  q.op(0x8e).le(3, 8).raw(std::string_view("k\0y", 3)).op(0x86);
  auto d = decode_worker_registration_pickle(q.stop());
  REQUIRE_MESSAGE(d.value, d.error);
  CHECK(d.value->addresses[0].first == "ib0\xc3\xa9");
  CHECK(d.value->addresses[0].second
        == std::vector<std::pair<std::string, uint16_t>>{{"::ffff:1", 443}});
  CHECK(d.value->key == std::string("k\0y", 3));

  pk r; // LONG_BINGET of a memoized tuple shared by two interfaces
  r.op('}').op('(').str("a").op(']').str("10.0.0.9").op('M').le(8080, 2).op(0x86);
  r.op('r').le(7, 4).op('a').str("b").op(']').op('j').le(7, 4).op('a').op('u');
  r.bytes("x").op(0x86);
  auto e = decode_worker_registration_pickle(r.stop());
  REQUIRE_MESSAGE(e.value, e.error);
  CHECK(to_string(*e.value) == "a: 10.0.0.9:8080, b: 10.0.0.9:8080 (key: 1 bytes)");
}

TEST_CASE("horovod wire: pickles that name or call anything are refused") {
  auto e1 = refusal(unhex(system_p2));
  CHECK(e1 == "GLOBAL (0x63) at offset 2 is not allowed in this pickle (it names posix.system)");
  auto e2 = refusal(unhex(system_p5));
  CHECK(e2
        == "STACK_GLOBAL (0x93) at offset 28 is not allowed in this pickle (it names "
           "posix.system)");
  auto e3 = decode_worker_registration(system_in_registration);
  CHECK_FALSE(e3.value);
  CHECK(contains(e3.error, "STACK_GLOBAL (0x93) at offset"));
  CHECK(contains(e3.error, "posix.system"));

  // Protocol 2 writes bytes as a call of _codecs.encode: no call is read, not even that.
  auto p2 = decode_worker_registration(two_p2);
  CHECK_FALSE(p2.value);
  CHECK(contains(p2.error, "GLOBAL (0x63) at offset"));
  CHECK(contains(p2.error, "(it names _codecs.encode)"));
  pk reduce_list; // REDUCE of anything
  reduce_list.b = std::string("\x80\x02", 2);
  reduce_list.op(']').op(')').op('R');
  CHECK(contains(refusal(reduce_list.stop()), "REDUCE (0x52) at offset 4 is not allowed"));

  for (int c : std::initializer_list<int>{'b', 'i', 'o', 0x81, 0x92, 'P', 'Q', 0x82, 0x83, 0x84,
                                          'N', 0x88, 'G', 0x97}) {
    pk p;
    p.op(c);
    auto why = refusal(p.stop());
    CAPTURE(why);
    CHECK(contains(why, "at offset 2 is not allowed"));
  }
  pk unknown;
  unknown.op(0xff);
  CHECK(refusal(unknown.stop()) == "unknown opcode 0xff at offset 2 is not allowed in this pickle");
}

TEST_CASE("horovod wire: truncated input and bad base64") {
  auto full = unhex("8005956e000000000000007d94288c026c6f945d948c093132372e302e302e31944d12a1869461"
                    "8c0465746830945d94288c0831302e302e302e35944d12a186948c0831302e302e302e3694"
                    "4d12a1869465754320000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c"
                    "1d1e1f9486942e");
  REQUIRE(decode_worker_registration_pickle(full).value);
  for (size_t n = 0; n < full.size(); ++n) {
    CAPTURE(n);
    CHECK_FALSE(decode_worker_registration_pickle(full.substr(0, n)).value);
  }
  CHECK(refusal(full.substr(0, 40)) == "FRAME (0x95) at offset 2: a frame of 110 bytes, 29 left");
  pk no_stop;
  no_stop.op('}');
  CHECK(refusal(no_stop.b) == "the pickle ends at offset 3 before STOP");
  CHECK(refusal(full + "x") == "STOP (0x2e) at offset 120: 1 bytes after STOP");

  std::string b64 = two_codec;
  for (size_t n = 0; n < b64.size(); ++n)
    CHECK_FALSE(decode_worker_registration(b64.substr(0, n)).value);
  CHECK(decode_worker_registration("abc").error
        == "the body is not base64: 3 characters (a multiple of 4 expected)");
  CHECK(decode_worker_registration("ab!d").error == "the body is not base64: '!' at offset 2");
  CHECK(decode_worker_registration("ab=d").error == "the body is not base64: '=' at offset 2");
  CHECK(decode_worker_registration("ab==abcd").error == "the body is not base64: '=' at offset 2");
  CHECK(decode_worker_registration(b64 + "\n").error
        == "the body is not base64: " + std::to_string(b64.size() + 1)
               + " characters (a multiple of 4 expected)");
  CHECK(decode_worker_registration(b64.substr(0, b64.size() - 4) + "\r\n\r\n").error
        == "the body is not base64: byte 0x0d at offset " + std::to_string(b64.size() - 4));
  CHECK(decode_worker_registration("").error == "the pickle is empty");
}

TEST_CASE("horovod wire: registrations of the wrong shape") {
  CHECK(decode_worker_registration_pickle(registration("eth0", "10.0.0.1", 1)).value);
  CHECK(decode_worker_registration_pickle(registration("eth0", "10.0.0.1", 65535)).value);
  CHECK(refusal(registration("eth0", "10.0.0.1", 0))
        == "interface 'eth0': port 0 of 10.0.0.1 is not within 1-65535");
  CHECK(refusal(registration("eth0", "10.0.0.1", 65536))
        == "interface 'eth0': port 65536 of 10.0.0.1 is not within 1-65535");
  CHECK(refusal(registration("eth0", "10.0.0.1", -1))
        == "interface 'eth0': port -1 of 10.0.0.1 is not within 1-65535");
  CHECK(refusal(registration("eth0", "localhost", 80))
        == "interface 'eth0': 'localhost' is not an IPv4 or IPv6 address");
  CHECK(refusal(registration("eth0", "10.0.0.1 ", 80))
        == "interface 'eth0': '10.0.0.1 ' is not an IPv4 or IPv6 address");
  CHECK(refusal(registration("eth0", "fe80::1%eth0", 80))
        == "interface 'eth0': 'fe80::1%eth0' is not an IPv4 or IPv6 address");
  CHECK(refusal(registration("", "10.0.0.1", 80)) == "an interface name of 0 bytes (1 to 256)");
  CHECK(refusal(registration("et\nh0", "10.0.0.1", 80))
        == "interface 'et?h0' has a control character in its name");
  CHECK(refusal(registration("eth0", "10.0.0.1", 80, [](pk& p) { p.str("key"); }))
        == "the registration is not ({interface: [(ip, port), ...]}, key): the key is a str, "
           "not bytes");
  CHECK(refusal(registration("eth0", "10.0.0.1", 80, [](pk& p) { p.bytes(""); }))
        == "the key has 0 bytes (1 to 1024 are accepted)");
  CHECK(
      refusal(registration("eth0", "10.0.0.1", 80, [](pk& p) { p.bytes(std::string(1025, 'k')); }))
      == "the key has 1025 bytes (1 to 1024 are accepted)");
  CHECK(decode_worker_registration_pickle(registration("eth0", "10.0.0.1", 80, [](pk& p) {
          p.bytes(std::string(1024, 'k'));
        })).value);

  pk list_top; // [{}, key] instead of a tuple
  list_top.op(']').op('}').op('a').bytes(key).op('a');
  CHECK(refusal(list_top.stop())
        == "the registration is not ({interface: [(ip, port), ...]}, key): got a list of 2 "
           "item(s)");
  pk empty; // ({}, key)
  empty.op('}').bytes(key).op(0x86);
  CHECK(refusal(empty.stop()) == "the registration has no address");
  pk triple; // an address of three items
  triple.op('}').str("eth0").op(']').str("10.0.0.1").i32(80).i32(0).op(0x87).op('a').op('s');
  triple.bytes(key).op(0x86);
  CHECK(refusal(triple.stop())
        == "the registration is not ({interface: [(ip, port), ...]}, key): an address of 'eth0' "
           "is a tuple of 3 item(s), not (ip, port)");
  pk swapped; // (port, ip)
  swapped.op('}').str("eth0").op(']').i32(80).str("10.0.0.1").op(0x86).op('a').op('s');
  swapped.bytes(key).op(0x86);
  CHECK(contains(refusal(swapped.stop()), "is (int, str), not (str, int)"));
  pk twice; // the same interface twice
  twice.op('}').op('(').str("eth0").op(']').str("10.0.0.1").i32(80).op(0x86).op('a');
  twice.str("eth0").op(']').op('u').bytes(key).op(0x86);
  CHECK(refusal(twice.stop()) == "interface 'eth0' appears twice");
  pk dict_key; // a list as an interface name
  dict_key.op('}').op(']').op(']').op('s').bytes(key).op(0x86);
  CHECK(contains(refusal(dict_key.stop()), "an interface name is a list"));
  pk self_list; // a list that holds itself: refused by shape, no endless walk
  self_list.op('}').str("eth0").op(']').op(0x94).op('h').le(0, 1).op('a').op('s').bytes(key);
  self_list.op(0x86);
  CHECK(contains(refusal(self_list.stop()), "an address of 'eth0' is a list of 1 item(s)"));

  pk not_utf8;
  not_utf8.op(0x8c).le(1, 1).raw("\xff");
  CHECK(refusal(not_utf8.stop())
        == "SHORT_BINUNICODE (0x8c) at offset 2: a str that is not "
           "valid UTF-8");
  pk append_to_dict;
  append_to_dict.op('}').op('}').op('a');
  CHECK(refusal(append_to_dict.stop())
        == "APPEND (0x61) at offset 4: APPEND's target must be a list, is a dict");
  pk odd_items;
  odd_items.op('}').op('(').str("a").op('u');
  CHECK(refusal(odd_items.stop())
        == "SETITEMS (0x75) at offset 7: an odd number of items (keys and values come in "
           "pairs)");
  pk below_mark; // TUPLE2 may not take values from below the MARK
  below_mark.str("a").op('(').str("b").op(0x86);
  CHECK(refusal(below_mark.stop())
        == "TUPLE2 (0x86) at offset 9: needs 2 value(s) on the stack above the last MARK, has 1");
  pk unknown_memo;
  unknown_memo.op('h').le(3, 1);
  CHECK(refusal(unknown_memo.stop()) == "BINGET (0x68) at offset 2: memo entry 3 was never stored");
  pk leftover;
  leftover.op('}').op('}');
  CHECK(refusal(leftover.stop()) == "STOP (0x2e) at offset 4: 1 value(s) and 0 MARK(s) left over");
  pk proto1;
  proto1.b = std::string("\x80\x01", 2);
  CHECK(refusal(proto1.stop()) == "PROTO (0x80) at offset 0: protocol 1 (2 to 5 are read)");
  CHECK(refusal("(dp0\n.")
        == "a pickle of protocol 2 or later starts with PROTO (0x80), this one with MARK (0x28)");
  pk proto_again;
  proto_again.op(0x80).le(4, 1);
  CHECK(refusal(proto_again.stop())
        == "PROTO (0x80) at offset 2: PROTO is only allowed at offset 0");
  pk wide_long;
  wide_long.op(0x8a).le(9, 1).le(0, 8).le(1, 1);
  CHECK(refusal(wide_long.stop())
        == "LONG1 (0x8a) at offset 2: an integer of 9 bytes (at most 8 are read)");
  pk long_frame;
  long_frame.op(0x95).le(100, 8);
  CHECK(refusal(long_frame.stop()) == "FRAME (0x95) at offset 2: a frame of 100 bytes, 1 left");
}

TEST_CASE("horovod wire: registrations over the limits") {
  using L = registration_limits;
  CHECK(decode_worker_registration(std::string((L::max_pickle + 2) / 3 * 4 + 4, 'A')).error
        == "the body has 87388 bytes (at most 87384 of base64)");
  CHECK(refusal(std::string(L::max_pickle + 1, '\x80'))
        == "the registration pickle has 65537 bytes (at most 65536)");
  pk long_str;
  long_str.op('X').le(L::max_string + 1, 4).raw(std::string(L::max_string + 1, 'a'));
  CHECK(refusal(long_str.stop())
        == "BINUNICODE (0x58) at offset 2: a string of 4097 bytes (at most 4096)");
  pk huge_len; // a length far past the input: refused before anything is read or allocated
  huge_len.op(0x8e).le(~uint64_t{0}, 8);
  CHECK(refusal(huge_len.stop())
        == "BINBYTES8 (0x8e) at offset 2: a string of 18446744073709551615 bytes (at most 4096)");
  pk deep;
  for (size_t i = 0; i <= L::max_stack; ++i)
    deep.op(']');
  CHECK(refusal(deep.stop())
        == "EMPTY_LIST (0x5d) at offset 1026: more than 1024 values on the "
           "stack");
  pk marks;
  for (size_t i = 0; i <= L::max_marks; ++i)
    marks.op('(');
  CHECK(refusal(marks.stop()) == "MARK (0x28) at offset 34: more than 32 open MARKs");
  pk memo;
  memo.op(']');
  for (size_t i = 0; i <= L::max_memo; ++i)
    memo.op('r').le(i, 4);
  CHECK(contains(refusal(memo.stop()), "more than 8192 memo entries"));

  // Interfaces and addresses: one list shared by every interface costs a few bytes each.
  auto many = [](size_t interfaces, size_t per_list) {
    pk q;
    q.op('}').op('(');
    for (size_t i = 0; i < interfaces; ++i) {
      q.str("if" + std::to_string(i));
      if (i == 0) {
        q.op(']');
        for (size_t k = 0; k < per_list; ++k)
          q.str("10.0.0.1").i32(80).op(0x86).op('a');
        q.op('r').le(0, 4);
      } else {
        q.op('j').le(0, 4);
      }
    }
    q.op('u').bytes(key).op(0x86);
    return q.stop();
  };
  CHECK(decode_worker_registration_pickle(many(64, 4)).value);
  CHECK(refusal(many(65, 1)) == "65 interfaces (at most 64)");
  CHECK(decode_worker_registration_pickle(many(1, 256)).value);
  CHECK(refusal(many(1, 257)) == "more than 256 addresses");
  CHECK(refusal(many(2, 129)) == "more than 256 addresses");
}

TEST_CASE("horovod wire: HostsUpdatedRequest is what cloudpickle writes with the real classes") {
  CHECK(encode_hosts_updated(1700000000, 1) == unhex(hur_removed));
  CHECK(encode_hosts_updated(1700000000, 2) == unhex(hur_added));
  CHECK(encode_hosts_updated(1700000000, 0) == unhex(hur_no_update));
  CHECK(encode_hosts_updated(1700000000, 3) == unhex(hur_mixed));
  CHECK_THROWS_AS(encode_hosts_updated(1, 4), std::invalid_argument);

  // Timestamps take each of Python's integer encodings (HostUpdateResult.added). The
  // fixtures' timestamp fields, from the same command with T = each value:
  struct ts_case {
    int64_t t;
    const char* field;
  };
  for (auto [t, field] : std::initializer_list<ts_case>{{0, "4b00"},
                                                        {255, "4bff"},
                                                        {256, "4d0001"},
                                                        {65535, "4dffff"},
                                                        {65536, "4a00000100"},
                                                        {-1, "4affffffff"},
                                                        {-2147483648LL, "4a00000080"},
                                                        {2147483648LL, "8a050000008000"},
                                                        {1099511627776LL, "8a06000000000001"},
                                                        {-2147483649LL, "8a05ffffff7fff"},
                                                        {INT64_MAX, "8a08ffffffffffffff7f"},
                                                        {INT64_MIN, "8a080000000000000080"}}) {
    CAPTURE(t);
    auto body = unhex(std::string(hur_prefix) + field + hur_middle + "8c056164646564" + hur_end);
    std::string frame_len;
    for (int i = 0; i < 8; ++i)
      frame_len += static_cast<char>((body.size() >> (8 * i)) & 0xff);
    CHECK(encode_hosts_updated(t, 2) == std::string("\x80\x04\x95", 3) + frame_len + body);
  }
}

TEST_CASE("horovod wire: framing") {
  auto ack = unhex(ack_p5);
  // Byte for byte what horovod's Wire.write sends.
  CHECK(frame_message(key, ack) == unhex(wire_ack));
  auto framed = unhex(wire_ack);
  auto f = parse_framed_message(key, framed);
  REQUIRE(f.what == parsed_frame::status::complete);
  CHECK(f.body == ack);
  CHECK(f.used == framed.size());
  // Followed by more bytes: only the first message is taken.
  auto g = parse_framed_message(key, framed + "tail");
  CHECK(g.what == parsed_frame::status::complete);
  CHECK(g.used == framed.size());
  for (size_t n = 0; n < framed.size(); ++n)
    CHECK(parse_framed_message(key, framed.substr(0, n)).what == parsed_frame::status::incomplete);
  CHECK(parse_framed_message(key, frame_message(key, "")).what == parsed_frame::status::complete);

  // A flipped bit anywhere in the digest or the body, or another key: a mismatch, and the
  // body is not handed out.
  for (size_t i : {size_t{0}, size_t{31}, size_t{36}, framed.size() - 1}) {
    auto bad = framed;
    bad[i] = static_cast<char>(bad[i] ^ 1);
    auto b = parse_framed_message(key, bad);
    CHECK(b.what == parsed_frame::status::bad_digest);
    CHECK(b.body.empty());
  }
  auto other_key = key;
  other_key[5] = 'x';
  CHECK(parse_framed_message(other_key, framed).what == parsed_frame::status::bad_digest);

  auto with_len = [](uint32_t len) {
    std::string m(32, '\0');
    for (int i = 0; i < 4; ++i)
      m += static_cast<char>((len >> (8 * i)) & 0xff);
    return m;
  };
  CHECK(parse_framed_message(key, with_len(0xffffffff)).what == parsed_frame::status::bad_length);
  CHECK(parse_framed_message(key, with_len(64 << 10)).what == parsed_frame::status::incomplete);
  CHECK(parse_framed_message(key, with_len((64 << 10) + 1)).what
        == parsed_frame::status::bad_length);
  CHECK(parse_framed_message(key, with_len(100), 99).what == parsed_frame::status::bad_length);
}

TEST_CASE("horovod wire: AckResponse is recognised by its class name only") {
  CHECK(check_ack_response(unhex(ack_p5)) == "");
  CHECK(check_ack_response(unhex(ack_p2)) == "");
  CHECK(contains(check_ack_response(unhex(ping_p5)), "BUILD (0x62) at offset"));
  CHECK(contains(check_ack_response(unhex(hur_removed)), "REDUCE (0x52) at offset"));
  CHECK(check_ack_response(unhex(system_p5))
        == "something other than an AckResponse: REDUCE (0x52) at offset 37 is not allowed in "
           "this pickle");
  pk ping_class; // the class alone, not an object of it
  ping_class.str("horovod.runner.common.util.network").str("AckResponse").op(0x93);
  CHECK(check_ack_response(ping_class.stop()) == "a global, not an AckResponse");
  pk other;
  other.str("mymodule").str("AckResponse").op(0x93).op(')').op(0x81);
  CHECK(check_ack_response(other.stop()) == "mymodule.AckResponse, not an AckResponse");
  pk with_args;
  with_args.str("horovod.runner.common.util.network").str("AckResponse").op(0x93);
  with_args.str("x").op(0x85).op(0x81);
  CHECK(contains(check_ack_response(with_args.stop()), "NEWOBJ with arguments"));
  CHECK(contains(check_ack_response(""), "the pickle is empty"));
}

// ---------------------------------------------------------------------------------------
// The client against workers played by a thread: each serves one connection.

namespace {

struct fake_worker {
  int fd = -1;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> got_request{false};

  // `answer(request_bytes, conn)` runs once a whole framed request came.
  explicit fake_worker(std::function<void(const std::string&, int)> answer, bool v6 = false) {
    fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_storage ss{};
    socklen_t len;
    if (v6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(*a);
    }
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0);
    port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    thread = std::thread([this, answer] {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1)
        return;
      int conn = ::accept(fd, nullptr, nullptr);
      if (conn < 0)
        return;
      std::string in;
      char buf[4096];
      for (;;) { // the framed request, as horovod's Wire.read takes it
        auto f = parse_framed_message(key, in);
        if (f.what != parsed_frame::status::incomplete) {
          got_request = f.what == parsed_frame::status::complete;
          break;
        }
        pollfd q{conn, POLLIN, 0};
        if (::poll(&q, 1, 10000) != 1)
          break;
        auto n = ::read(conn, buf, sizeof(buf));
        if (n <= 0)
          break;
        in.append(buf, static_cast<size_t>(n));
      }
      answer(in, conn);
      ::close(conn);
    });
  }
  // Waits for the connection to be served.
  void finish() {
    if (thread.joinable())
      thread.join();
  }
  ~fake_worker() {
    finish();
    ::close(fd);
  }
};

void send_all(int fd, const std::string& s) {
  CHECK(::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()));
}

// Waits (up to 10 s) for the client to close its end.
void wait_for_close(int fd) {
  char buf[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1 || ::read(fd, buf, sizeof(buf)) <= 0)
      return;
  }
}

// A loopback port with nothing listening: bound, never listened on, so that nobody else
// takes it while the test runs; a connect gets a reset (ECONNREFUSED).
struct closed_port {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  uint16_t port = 0;
  closed_port() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~closed_port() { ::close(fd); }
};

worker_registration worker_at(std::vector<std::pair<std::string, uint16_t>> addrs) {
  return worker_registration{{{"lo", std::move(addrs)}}, key};
}

void check_no_key(const notify_result& r) {
  auto text = to_string(r);
  CHECK_FALSE(contains(text, key));
  CHECK_FALSE(contains(text, "5f0e9c2a"));
  CHECK_FALSE(contains(text, "Xw6cKn")); // the key's base64
}

using namespace std::chrono_literals;

} // namespace

TEST_CASE("horovod wire: the client gets a worker's AckResponse") {
  std::string request;
  fake_worker w{[&](const std::string& in, int conn) {
    request = in;
    send_all(conn, unhex(wire_ack)); // bytes from horovod's own Wire.write
  }};
  auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1700000000, 1, 5s);
  w.finish();
  CHECK(w.got_request);
  CHECK(request == frame_message(key, unhex(hur_removed)));
  CHECK(r.ok);
  REQUIRE(r.attempts.size() == 1);
  CHECK(r.attempts[0].what == notify_attempt::outcome::acknowledged);
  CHECK(r.attempts[0].address == "127.0.0.1:" + std::to_string(w.port));
}

TEST_CASE("horovod wire: the client tries the addresses in order") {
  closed_port refused;
  fake_worker w{
      [](const std::string&, int conn) { send_all(conn, frame_message(key, unhex(ack_p2))); }};
  worker_registration reg{{{"eth0", {{"127.0.0.1", refused.port}}},
                           {"lo", {{"127.0.0.1", w.port}, {"127.0.0.1", refused.port}}}},
                          key};
  auto r = notify_hosts_updated(reg, 5, 2, 5s);
  CHECK(r.ok);
  REQUIRE(r.attempts.size() == 2); // the third address is not tried
  CHECK(r.attempts[0].what == notify_attempt::outcome::refused);
  CHECK(r.attempts[0].interface == "eth0");
  CHECK(r.attempts[1].what == notify_attempt::outcome::acknowledged);
  CHECK(to_string(r)
        == "eth0 127.0.0.1:" + std::to_string(refused.port)
               + ": connection refused (connect: Connection refused); lo 127.0.0.1:"
               + std::to_string(w.port) + ": acknowledged");
  check_no_key(r);
}

TEST_CASE("horovod wire: the client over IPv6") {
  int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool has_v6 = probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (probe >= 0)
    ::close(probe);
  if (!has_v6) {
    if (std::getenv("CI"))
      FAIL("no IPv6 loopback here, and CI machines have one");
    MESSAGE("no IPv6 loopback here; skipped");
    return;
  }
  fake_worker w{[](const std::string&, int conn) { send_all(conn, unhex(wire_ack)); }, true};
  auto r = notify_hosts_updated(worker_at({{"::1", w.port}}), 7, 3, 5s);
  CHECK(r.ok);
  REQUIRE(r.attempts.size() == 1);
  CHECK(r.attempts[0].address == "[::1]:" + std::to_string(w.port));
}

TEST_CASE("horovod wire: an answer with the wrong digest, or the wrong answer") {
  SUBCASE("digest of another key") {
    auto other = key;
    other[0] = 'x';
    fake_worker w{
        [&](const std::string&, int conn) { send_all(conn, frame_message(other, unhex(ack_p5))); }};
    auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1, 1, 5s);
    CHECK_FALSE(r.ok);
    REQUIRE(r.attempts.size() == 1);
    CHECK(r.attempts[0].what == notify_attempt::outcome::digest_mismatch);
    check_no_key(r);
  }
  SUBCASE("a PingResponse") {
    fake_worker w{
        [](const std::string&, int conn) { send_all(conn, frame_message(key, unhex(ping_p5))); }};
    auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1, 1, 5s);
    CHECK_FALSE(r.ok);
    REQUIRE(r.attempts.size() == 1);
    CHECK(r.attempts[0].what == notify_attempt::outcome::unexpected_answer);
    CHECK(contains(r.attempts[0].detail, "answered something other than an AckResponse"));
  }
  SUBCASE("closed without answering, as a worker does for a wrong key") {
    fake_worker w{[](const std::string&, int) {}};
    auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1, 1, 5s);
    CHECK_FALSE(r.ok);
    REQUIRE(r.attempts.size() == 1);
    CHECK(r.attempts[0].what == notify_attempt::outcome::closed);
    CHECK(contains(r.attempts[0].detail, "refuses our key"));
    check_no_key(r);
  }
  SUBCASE("half an answer") {
    fake_worker w{
        [](const std::string&, int conn) { send_all(conn, unhex(wire_ack).substr(0, 50)); }};
    auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1, 1, 5s);
    REQUIRE(r.attempts.size() == 1);
    CHECK(r.attempts[0].what == notify_attempt::outcome::closed);
    CHECK(r.attempts[0].detail == "closed the connection after 50 bytes of an answer");
  }
}

TEST_CASE("horovod wire: a worker that never answers costs the deadline, not more") {
  // The worker reads the request and then holds the connection open until the client
  // gives up; with a 300 ms deadline the call must return within 300 ms to 2 s.
  fake_worker w{[](const std::string&, int conn) { wait_for_close(conn); }};
  auto start = std::chrono::steady_clock::now();
  auto r = notify_hosts_updated(worker_at({{"127.0.0.1", w.port}}), 1, 1, 300ms);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(took >= 300ms);
  CHECK(took < 2s);
  CHECK(w.got_request);
  CHECK_FALSE(r.ok);
  REQUIRE(r.attempts.size() == 1);
  CHECK(r.attempts[0].what == notify_attempt::outcome::timed_out);
  CHECK(r.attempts[0].detail == "no answer within 300 ms (0 bytes came)");
}

TEST_CASE("horovod wire: refused ports, bad addresses, bad results") {
  closed_port p;
  auto r = notify_hosts_updated(worker_at({{"127.0.0.1", p.port}, {"not-an-ip", 1}}), 1, 1, 1s);
  CHECK_FALSE(r.ok);
  REQUIRE(r.attempts.size() == 2);
  CHECK(r.attempts[0].what == notify_attempt::outcome::refused);
  CHECK(r.attempts[1].what == notify_attempt::outcome::bad_address);
  check_no_key(r);

  auto none = notify_hosts_updated(worker_registration{{}, key}, 1, 1, 1s);
  CHECK_FALSE(none.ok);
  CHECK(to_string(none) == "no address to notify");

  auto bad_res = notify_hosts_updated(worker_at({{"127.0.0.1", p.port}}), 1, 4, 1s);
  CHECK_FALSE(bad_res.ok);
  REQUIRE(bad_res.attempts.size() == 1);
  CHECK(bad_res.attempts[0].detail == "HostUpdateResult 4 is not 0-3; nothing sent");
  CHECK(to_string(bad_res) == "HostUpdateResult 4 is not 0-3; nothing sent");
}

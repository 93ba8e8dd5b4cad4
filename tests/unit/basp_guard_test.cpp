// The wire guard's parser (runtime/network/basp_guard.hpp) on frames that CAF 0.17.6's own
// serializer writes: BASP's header and payloads exactly as its instance writes them, so the
// formats the guard assumes are checked against CAF here. Every stream is also fed split
// at every offset: a refusal must come no later than the bytes of the offending frame's
// last byte, and a legitimate stream is never refused however it is cut.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp/message_type.hpp>

#include "runtime/network/basp_guard.hpp"

using namespace cafhvd::wire;
namespace basp = caf::io::basp;

namespace {

struct fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::node_id me = caf::make_node_id(1, "fedcba9876fedcba9876fedcba9876fedcba9876").value();
  caf::node_id peer = caf::make_node_id(4242, "0123456789012345678901234567890123456789").value();
  caf::node_id other = caf::make_node_id(77, "abcdefabcdefabcdefabcdefabcdefabcdefabcd").value();
  guard_policy policy;

  fixture() {
    policy.max_payload = 1 << 20;
    policy.this_node = bytes(me);
    policy.named_actors = {static_cast<uint64_t>(caf::atom("SpawnServ"))};
    policy.link_atom = caf::link_atom::uint_value();
    policy.unlink_atom = caf::unlink_atom::uint_value();
  }

  template <class... Ts> std::string bytes(Ts&&... xs) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    if (auto err = sink(xs...))
      FAIL("serializing failed");
    return {buf.begin(), buf.end()};
  }

  // One frame: CAF's header, then the payload (its length filled in as CAF does).
  std::string frame(basp::message_type op, uint8_t flags, uint64_t op_data, uint64_t src,
                    uint64_t dst, const std::string& payload) {
    basp::header hdr{op, flags, static_cast<uint32_t>(payload.size()), op_data, src, dst};
    auto h = bytes(hdr);
    REQUIRE(h.size() == basp_header_size);
    return h + payload;
  }

  std::string client_hs(const caf::node_id& n, uint8_t flags = 0) {
    return frame(basp::message_type::client_handshake, flags, 0, 0, 0, bytes(n));
  }
  std::string server_hs(const caf::node_id& n,
                        std::vector<std::string> app_ids = {"caf-hvd"}) {
    caf::actor_id aid = 0;
    std::set<std::string> sigs;
    return frame(basp::message_type::server_handshake, 0, 3, 0, 0, bytes(n, app_ids, aid, sigs));
  }
  std::string direct(uint64_t dst, caf::message msg, uint8_t flags = 0) {
    std::vector<caf::strong_actor_ptr> stages;
    return frame(basp::message_type::direct_message, flags, 1, 7, dst, bytes(stages, msg));
  }
  std::string routed(const caf::node_id& src, const caf::node_id& dst) {
    std::vector<caf::strong_actor_ptr> stages;
    auto msg = caf::make_message(caf::atom("launch"));
    return frame(basp::message_type::routed_message, 0, 1, 7, 9, bytes(src, dst, stages, msg));
  }
  std::string monitor(const caf::node_id& src, const caf::node_id& dst) {
    return frame(basp::message_type::monitor_message, 0, 0, 0, 12, bytes(src, dst));
  }
  std::string down(const caf::node_id& src, const caf::node_id& dst) {
    caf::error reason = caf::exit_reason::remote_link_unreachable;
    return frame(basp::message_type::down_message, 0, 0, 12, 0, bytes(src, dst, reason));
  }
  std::string heartbeat() { return frame(basp::message_type::heartbeat, 0, 0, 0, 0, {}); }

  // Feeds `stream` in two parts cut at every offset (and once byte by byte): the verdict
  // is the same for every cut, and a refusal comes with the call holding its frame's end.
  std::string verdict(const std::string& stream, bool server = true, size_t frame_end = 0) {
    std::string first;
    for (size_t cut = 0; cut <= stream.size(); ++cut) {
      basp_guard g{policy, server};
      auto a = g.feed(stream.substr(0, cut));
      auto b = g.feed(stream.substr(cut));
      if (cut == 0)
        first = b;
      CHECK_MESSAGE(b == first, "cut at " << cut);
      if (frame_end && cut >= frame_end)
        CHECK_MESSAGE(!a.empty(), "the offending frame was whole before cut " << cut);
    }
    basp_guard g{policy, server};
    std::string one;
    for (char c : stream)
      one = g.feed(std::string(1, c));
    CHECK(one == first);
    return first;
  }
};

} // namespace

TEST_CASE("wire guard: atoms are computed as CAF computes them") {
  for (auto name : {"SpawnServ", "ConfigServ", "link", "unlink", "default", "", "A_z09 x"})
    CHECK(atom_value(name) == static_cast<uint64_t>(caf::atom_from_string(name)));
}

TEST_CASE_FIXTURE(fixture, "wire guard: a driver's legitimate stream passes, however it is cut") {
  auto spawn = direct(static_cast<uint64_t>(caf::atom("SpawnServ")),
                      caf::make_message(caf::sys_atom::value, caf::get_atom::value, "info"),
                      0x01);
  auto s = client_hs(peer) + heartbeat() + spawn
           + direct(5, caf::make_message(caf::atom("workers"), std::string{"0,1"}))
           + monitor(peer, me) + down(peer, me) + client_hs(peer, 0x02) + heartbeat();
  CHECK(verdict(s) == "");
  basp_guard g{policy, true};
  g.feed(s);
  CHECK(g.frames() == 8);
  CHECK(g.peer_node() == bytes(peer));
  // the agent's side of the same connection
  CHECK(verdict(server_hs(peer) + direct(5, caf::make_message(caf::ok_atom::value)) + down(peer, me),
                false)
        == "");
}

TEST_CASE_FIXTURE(fixture, "wire guard: the accepting end's application ids are kept, however "
                           "its handshake is cut") {
  // the connect's error names both versions from them (CAF says only that they differ)
  auto hs = server_hs(peer, {"caf-hvd/2", "other"});
  for (size_t cut = 0; cut <= hs.size(); ++cut) {
    basp_guard g{policy, false};
    CHECK(g.feed(hs.substr(0, cut)) == "");
    if (cut <= basp_header_size + bytes(peer).size())
      CHECK_MESSAGE(g.peer_applications().empty(), "cut at " << cut);
    CHECK(g.feed(hs.substr(cut)) == "");
    CHECK_MESSAGE((g.peer_applications() == std::vector<std::string>{"caf-hvd/2", "other"}),
                  "cut at " << cut);
    CHECK(g.peer_node() == bytes(peer));
  }
  // none in a client's handshake, and none that do not parse (CAF refuses those itself)
  basp_guard client{policy, true};
  client.feed(client_hs(peer));
  CHECK(client.peer_applications().empty());
  basp_guard odd{policy, false};
  auto garbled = bytes(peer) + std::string("\xff\xff\xff\xff\xff\xff", 6);
  CHECK(odd.feed(frame(basp::message_type::server_handshake, 0, 3, 0, 0, garbled)) == "");
  CHECK(odd.peer_applications().empty());
  CHECK(odd.peer_node() == bytes(peer));
}

TEST_CASE_FIXTURE(fixture, "wire guard: each rule is refused with its reason, at the latest with "
                           "the offending frame's last byte") {
  auto hs = client_hs(peer);
  auto check = [&](const std::string& bad, const std::string& why) {
    CHECK(verdict(hs + bad, true, hs.size() + bad.size()) == why);
    // behind legitimate frames in one read too
    basp_guard g{policy, true};
    CHECK(g.feed(hs + heartbeat() + bad + heartbeat()) == why);
    CHECK(g.feed(heartbeat()) == why); // refused for good
  };
  check(routed(peer, me), "a routed message: this node forwards nothing and takes messages only "
                          "from its peer's own node");
  check(routed(me, other), "a routed message: this node forwards nothing and takes messages only "
                           "from its peer's own node");
  check(down(other, me), "a down message about another node than the peer's own");
  check(down(peer, other), "a down message for another node than this one");
  check(monitor(me, me), "a monitor message about another node than the peer's own");
  check(direct(static_cast<uint64_t>(caf::atom("ConfigServ")),
               caf::make_message(caf::put_atom::value, "x", caf::message{}), 0x01),
        "a direct message to a named actor other than the spawn server");
  auto target = sys.spawn([] { return caf::behavior{[](int) {}}; });
  auto proxy = caf::actor_cast<caf::strong_actor_ptr>(target);
  check(direct(5, caf::make_message(caf::link_atom::value, proxy)),
        "a link or unlink message: no peer links this node's actors to its own");
  check(direct(5, caf::make_message(caf::unlink_atom::value, proxy)),
        "a link or unlink message: no peer links this node's actors to its own");
  caf::anon_send_exit(target, caf::exit_reason::kill);
  check(client_hs(other), "a repeated handshake claiming another node id");
  check(server_hs(peer), "a server handshake from the connecting end");
  check(frame(basp::message_type::heartbeat, 0, 0, 0, 0, "x"), "a heartbeat with content");
  // a frame whose announced size is above the cap: refused on its header alone
  std::string big = frame(basp::message_type::direct_message, 0, 1, 7, 5, "")
                        .substr(0, basp_header_size);
  big[4] = 0x7f; // payload_len 0x7f000000
  basp_guard g{policy, true};
  CHECK(g.feed(hs + big) == "a direct message of 2130706432 bytes, above the cap of 1048576 bytes");
  std::string unknown = big;
  unknown[0] = 9;
  CHECK(verdict(hs + unknown) == "a frame of unknown operation 9");
}

TEST_CASE_FIXTURE(fixture, "wire guard: the handshake comes first and names an admitted node") {
  auto msg = direct(5, caf::make_message(caf::atom("workers"), std::string{"0"}));
  CHECK(verdict(msg) == "a direct message before its handshake");
  CHECK(verdict(heartbeat()) == "a heartbeat before its handshake");
  CHECK(verdict(down(peer, me)) == "a down message before its handshake");
  CHECK(verdict(client_hs(me)) == "a handshake claiming this node's own id");
  CHECK(verdict(client_hs(caf::node_id{})) == "a client handshake without a valid node id");
  CHECK(verdict(server_hs(peer), false) == "");
  CHECK(verdict(server_hs(peer) + server_hs(peer), false) == "a second server handshake");
  // the caller's claim decides (the TLS layer binds node ids to certificates)
  std::vector<std::string> claims;
  basp_guard g{policy, true, [&](const std::string& n) {
                 claims.push_back(n);
                 return n == bytes(other) ? std::string{"bound elsewhere"} : std::string{};
               }};
  CHECK(g.feed(client_hs(peer) + client_hs(peer, 0x02)) == "");
  CHECK(claims.size() == 1); // asked once per connection
  basp_guard h{policy, true, [&](const std::string& n) {
                 return n == bytes(other) ? std::string{"bound elsewhere"} : std::string{};
               }};
  CHECK(h.feed(client_hs(other)) == "bound elsewhere");
}

TEST_CASE("wire guard: node ids of the kinds CAF writes") {
  CHECK(node_id_size(std::string(7, '\0')) == 0);
  std::string none(8, '\0');
  none[7] = 0x0f;
  CHECK(node_id_size(none) == 8);
  std::string uri(8, '\0');
  auto u = atom_value("uri");
  for (int i = 0; i < 8; ++i)
    uri[i] = static_cast<char>(u >> (56 - 8 * i));
  CHECK(node_id_size(uri + "xxxx") == -1);
}

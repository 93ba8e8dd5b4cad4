// Byte-level conformance of the TCPStore state machine in every dialect, written from
// torch's client and servers at v1.13.1 and v2.6.0 (and main for queues, LIST_KEYS and
// BARRIER): what each query sends and what comes back, byte for byte.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>

#include "runtime/torch/torch_store_protocol.hpp"

using namespace cafhvd;

namespace {

// Builds a request the way torch's client sends it.
struct req {
  std::string b;
  explicit req(uint8_t type) { b.push_back(static_cast<char>(type)); }
  template <class T> req& v(T x) {
    b.append(reinterpret_cast<const char*>(&x), sizeof(T));
    return *this;
  }
  req& s(const std::string& x) {
    v<uint64_t>(x.size());
    b += x;
    return *this;
  }
  operator std::string() const { return b; }
};

template <class T> std::string raw(T x) {
  return std::string(reinterpret_cast<const char*>(&x), sizeof(T));
}
std::string bytes(const std::string& x) {
  return raw<uint64_t>(x.size()) + x;
}
const std::string stop(1, '\x00');
const std::string canceled(1, '\x01');
const std::string validate = std::string(1, '\x00') + raw<uint32_t>(0x3C85F7CE);

// Modern (torch 2.2+) type codes.
enum : uint8_t {
  m_set = 1,
  m_cas,
  m_get,
  m_add,
  m_check,
  m_wait,
  m_numkeys,
  m_delete,
  m_append,
  m_multi_get,
  m_multi_set,
  m_cancel,
  m_ping,
  m_qpush,
  m_qpop,
  m_qlen,
  m_list,
  m_barrier
};

struct store {
  torch_store_core core;
  store() {
    for (uint64_t c = 1; c <= 3; ++c)
      core.connect(c);
  }
  // Feeds `in` on `c`; returns what was sent to `c` (other connections' bytes go to
  // `others`).
  std::string feed(uint64_t c, const std::string& in) {
    last = core.feed(c, in);
    std::string mine;
    for (auto& s : last.sends)
      (s.conn == c ? mine : others[s.conn]) += s.bytes;
    return mine;
  }
  torch_store_core::result last;
  std::map<uint64_t, std::string> others;
};

} // namespace

TEST_CASE("torch 2.x: VALIDATE has no reply, PING echoes its nonce") {
  store st;
  CHECK(st.feed(1, validate) == "");
  CHECK(st.core.dialect(1) == torch_dialect::modern);
  CHECK(st.feed(1, req(m_ping).v<uint32_t>(0xdeadbeef)) == raw<uint32_t>(0xdeadbeef));
  CHECK_FALSE(st.last.close);
}

TEST_CASE("torch 2.x: every key/value query and its reply") {
  store st;
  st.feed(1, validate);
  CHECK(st.feed(1, req(m_set).s("/a").s(std::string("x\0y", 3))) == "");
  CHECK(st.feed(1, req(m_get).s("/a")) == bytes(std::string("x\0y", 3)));
  CHECK(st.feed(1, req(m_get).s("/missing")) == bytes(""));
  CHECK(st.feed(1, req(m_add).s("/n").v<int64_t>(5)) == raw<int64_t>(5));
  CHECK(st.feed(1, req(m_add).s("/n").v<int64_t>(-7)) == raw<int64_t>(-2));
  CHECK(st.feed(1, req(m_get).s("/n")) == bytes("-2")); // decimal text, as torch keeps it
  CHECK(st.feed(1, req(m_check).v<uint64_t>(2).s("/a").s("/n")) == std::string(1, '\x00'));
  CHECK(st.feed(1, req(m_check).v<uint64_t>(2).s("/a").s("/z")) == std::string(1, '\x01'));
  CHECK(st.feed(1, req(m_wait).v<uint64_t>(1).s("/a")) == stop);
  CHECK(st.feed(1, req(m_numkeys)) == raw<int64_t>(2));
  // COMPARE_SET: missing key with empty expected sets; missing with non-empty expected
  // answers the expected value and sets nothing; present key swaps only on a match and
  // answers the value after the operation.
  CHECK(st.feed(1, req(m_cas).s("/c").s("").s("one")) == bytes("one"));
  CHECK(st.feed(1, req(m_cas).s("/d").s("x").s("two")) == bytes("x"));
  CHECK(st.feed(1, req(m_check).v<uint64_t>(1).s("/d")) == std::string(1, '\x01'));
  CHECK(st.feed(1, req(m_cas).s("/c").s("nope").s("three")) == bytes("one"));
  CHECK(st.feed(1, req(m_cas).s("/c").s("one").s("three")) == bytes("three"));
  CHECK(st.feed(1, req(m_append).s("/c").s("+four")) == "");
  CHECK(st.feed(1, req(m_append).s("/new").s("v")) == "");
  CHECK(st.feed(1, req(m_multi_get).v<uint64_t>(3).s("/c").s("/new").s("/none"))
        == bytes("three+four") + bytes("v") + bytes(""));
  CHECK(st.feed(1, req(m_multi_set).v<int64_t>(2).s("/m1").s("1").s("/m2").s("2")) == "");
  CHECK(st.feed(1, req(m_get).s("/m2")) == bytes("2"));
  CHECK(st.feed(1, req(m_delete).s("/m1")) == raw<int64_t>(1));
  CHECK(st.feed(1, req(m_delete).s("/m1")) == raw<int64_t>(0));
  CHECK(st.feed(1, req(m_list))
        == raw<int64_t>(5) + bytes("/a") + bytes("/c") + bytes("/m2") + bytes("/n")
               + bytes("/new"));
  CHECK(st.feed(1, req(m_cancel)) == canceled); // nothing pending: still answered
  CHECK_FALSE(st.last.close);
}

TEST_CASE("torch 2.x: queues, a blocking pop wakes one waiter per item") {
  store st;
  st.feed(1, validate);
  st.feed(2, validate);
  st.feed(3, validate);
  CHECK(st.feed(1, req(m_qlen).s("/q")) == raw<int64_t>(0));
  CHECK(st.feed(1, req(m_qpop).s("/q")) == raw<int64_t>(0)); // empty: size only
  // Two blocking pops wait on the queue's key.
  CHECK(st.feed(2, req(m_wait).v<uint64_t>(1).s("/q")) == "");
  CHECK(st.feed(3, req(m_wait).v<uint64_t>(1).s("/q")) == "");
  CHECK(st.feed(1, req(m_qpush).s("/q").s("a")) == "");
  CHECK(st.others[2] == stop);
  CHECK(st.others.count(3) == 0);
  CHECK(st.feed(2, req(m_qpop).s("/q")) == raw<int64_t>(1) + bytes("a"));
  st.feed(1, req(m_qpush).s("/q").s("b"));
  CHECK(st.others[3] == stop);
  st.feed(1, req(m_qpush).s("/q").s("c"));
  CHECK(st.feed(1, req(m_qlen).s("/q")) == raw<int64_t>(2));
  CHECK(st.feed(1, req(m_check).v<uint64_t>(1).s("/q")) == std::string(1, '\x00'));
  CHECK(st.feed(3, req(m_qpop).s("/q")) == raw<int64_t>(2) + bytes("b"));
  CHECK(st.feed(3, req(m_qpop).s("/q")) == raw<int64_t>(1) + bytes("c"));
  CHECK(st.core.key_count() == 0); // queues are not keys
}

TEST_CASE("WAIT ends when the last missing key is set, on every waiting connection") {
  store st;
  for (uint64_t c = 1; c <= 3; ++c)
    st.feed(c, validate);
  CHECK(st.feed(1, req(m_wait).v<uint64_t>(2).s("/a").s("/b")) == "");
  CHECK(st.feed(2, req(m_wait).v<uint64_t>(1).s("/a")) == "");
  CHECK(st.core.waiting_count() == 2);
  st.feed(3, req(m_set).s("/a").s("1"));
  CHECK(st.others[2] == stop);    // its only key
  CHECK(st.others.count(1) == 0); // still needs /b
  st.feed(3, req(m_add).s("/b").v<int64_t>(1));
  CHECK(st.others[1] == stop);
  CHECK(st.core.waiting_count() == 0);
  // Setting the keys again sends nothing more.
  st.others.clear();
  st.feed(3, req(m_set).s("/a").s("2"));
  CHECK(st.others.empty());
}

TEST_CASE("CANCEL_WAIT: a timed-out wait is cancelled; a raced wake comes first") {
  store st;
  st.feed(1, validate);
  st.feed(2, validate);
  CHECK(st.feed(1, req(m_wait).v<uint64_t>(1).s("/k")) == "");
  CHECK(st.feed(1, req(m_cancel)) == canceled);
  st.feed(2, req(m_set).s("/k").s("v"));
  CHECK(st.others.count(1) == 0); // the cancelled wait is not answered any more
  // The wake raced the cancel: STOP_WAITING was already sent, then WAIT_CANCELED.
  CHECK(st.feed(1, req(m_wait).v<uint64_t>(1).s("/late")) == "");
  st.feed(2, req(m_set).s("/late").s("v"));
  CHECK(st.others[1] == stop);
  CHECK(st.feed(1, req(m_cancel)) == canceled);
}

TEST_CASE("BARRIER releases every member when the last arrives") {
  store st;
  for (uint64_t c = 1; c <= 3; ++c)
    st.feed(c, validate);
  CHECK(st.feed(1, req(m_barrier).s("/bar").v<int64_t>(3)) == "");
  CHECK(st.feed(2, req(m_barrier).s("/bar").v<int64_t>(3)) == "");
  CHECK(st.feed(3, req(m_barrier).s("/bar").v<int64_t>(3)) == stop);
  CHECK(st.others[1] == stop);
  CHECK(st.others[2] == stop);
}

TEST_CASE("torch 1.13: no handshake, SET=0 ... DELETE_KEY=8, WATCH_KEY refused") {
  store st;
  CHECK(st.feed(1, req(3).s("init/").v<int64_t>(1)) == raw<int64_t>(1)); // ADD
  CHECK(st.core.dialect(1) == torch_dialect::legacy_any);
  CHECK(st.feed(1, req(0).s("/k").s("v")) == "");                             // SET
  CHECK(st.feed(1, req(5).v<uint64_t>(1).s("/k")) == stop);                   // WAIT
  CHECK(st.feed(1, req(2).s("/k")) == bytes("v"));                            // GET
  CHECK(st.feed(1, req(1).s("/k").s("v").s("w")) == bytes("w"));              // COMPARE_SET
  CHECK(st.feed(1, req(4).v<uint64_t>(1).s("/k")) == std::string(1, '\x00')); // CHECK
  CHECK(st.feed(1, req(6)) == raw<int64_t>(2));                               // GETNUMKEYS
  CHECK(st.feed(1, req(8).s("/k")) == raw<int64_t>(1));                       // DELETE_KEY
  CHECK(st.core.dialect(1) == torch_dialect::legacy);
  st.feed(1, req(7).s("/w")); // WATCH_KEY
  CHECK(st.last.close);
  CHECK(st.last.problem.find("WATCH_KEY") != std::string::npos);
}

TEST_CASE("torch 2.1: no handshake, DELETE_KEY=7, APPEND=8 ... CANCEL_WAIT=11") {
  SUBCASE("APPEND sends its value with the key") {
    store st;
    CHECK(st.feed(1, req(8).s("/a").s("xy")) == "");
    CHECK(st.core.dialect(1) == torch_dialect::legacy21);
    CHECK(st.feed(1, req(8).s("/a").s("z")) == "");
    CHECK(st.feed(1, req(9).v<uint64_t>(1).s("/a")) == bytes("xyz")); // MULTI_GET
    CHECK(st.feed(1, req(7).s("/a")) == raw<int64_t>(1));             // DELETE_KEY
  }
  SUBCASE("MULTI_SET, a wait and its cancellation") {
    store st;
    CHECK(st.feed(1, req(10).v<int64_t>(1).s("/m").s("1")) == "");
    CHECK(st.core.dialect(1) == torch_dialect::legacy21);
    CHECK(st.feed(1, req(5).v<uint64_t>(1).s("/none")) == "");
    CHECK(st.feed(1, req(11)) == canceled);
  }
}

TEST_CASE("both dialects in one store share the keys") {
  store st;
  st.feed(1, validate);
  CHECK(st.feed(2, req(5).v<uint64_t>(1).s("/x")) == ""); // 1.13 client waits
  st.feed(1, req(m_set).s("/x").s("from 2.x"));
  CHECK(st.others[2] == stop);
  CHECK(st.feed(2, req(2).s("/x")) == bytes("from 2.x"));
  CHECK(st.feed(2, req(3).s("/n").v<int64_t>(1)) == raw<int64_t>(1));
  CHECK(st.feed(1, req(m_add).s("/n").v<int64_t>(1)) == raw<int64_t>(2));
}

TEST_CASE("a query split at every byte, and queries pipelined, answer the same") {
  std::string all = validate + std::string(req(m_ping).v<uint32_t>(7))
                    + std::string(req(m_set).s("/k").s("value"))
                    + std::string(req(m_add).s("/n").v<int64_t>(3))
                    + std::string(req(m_get).s("/k"));
  auto expected = raw<uint32_t>(7) + raw<int64_t>(3) + bytes("value");
  store whole;
  CHECK(whole.feed(1, all) == expected);
  store split;
  std::string got;
  for (char ch : all)
    got += split.feed(1, std::string(1, ch));
  CHECK(got == expected);
  CHECK(split.core.dialect(1) == torch_dialect::modern);
}

TEST_CASE("protocol violations close that connection only, and say what came") {
  store st;
  SUBCASE("an unknown query type from a 2.x client") {
    st.feed(1, validate);
    st.feed(1, req(19));
    CHECK(st.last.close);
    CHECK(st.last.problem == "query type 19 is not part of the torch 2.2+ store protocol");
  }
  SUBCASE("a second VALIDATE") {
    st.feed(1, validate);
    st.feed(1, validate);
    CHECK(st.last.close);
    CHECK(st.last.problem.find("VALIDATE") != std::string::npos);
  }
  SUBCASE("an unknown type without the handshake") {
    st.feed(1, req(12));
    CHECK(st.last.close);
    CHECK(st.last.problem.find("query type 12") != std::string::npos);
  }
  SUBCASE("a wrong magic reads as a legacy SET of an impossible key") {
    st.feed(1, std::string(1, '\x00') + raw<uint32_t>(0x3C85F7CF) + raw<uint32_t>(0));
    CHECK(st.last.close);
    CHECK(st.last.problem.find("over this store's limit") != std::string::npos);
  }
  SUBCASE("a value over the limit") {
    st.feed(1, validate);
    st.feed(1, req(m_set).s("/k").v<uint64_t>(uint64_t{1} << 40));
    CHECK(st.last.close);
  }
  SUBCASE("ADD to a value that is not a number") {
    st.feed(1, validate);
    st.feed(1, req(m_set).s("/k").s("abc"));
    st.feed(1, req(m_add).s("/k").v<int64_t>(1));
    CHECK(st.last.close);
    CHECK(st.last.problem.find("not a number") != std::string::npos);
  }
  st.core.disconnect(1);
  st.feed(2, validate);
  CHECK(st.feed(2, req(m_add).s("/ok").v<int64_t>(4)) == raw<int64_t>(4));
}

TEST_CASE("clear() is a fresh key space; a disconnected waiter is forgotten") {
  store st;
  st.feed(1, validate);
  st.feed(2, validate);
  st.feed(1, req(m_set).s("/old").s("1"));
  st.feed(1, req(m_qpush).s("/q").s("1"));
  st.core.clear();
  CHECK(st.feed(1, req(m_check).v<uint64_t>(1).s("/old")) == std::string(1, '\x01'));
  CHECK(st.feed(1, req(m_qlen).s("/q")) == raw<int64_t>(0));
  CHECK(st.feed(2, req(m_wait).v<uint64_t>(1).s("/w")) == "");
  st.core.disconnect(2);
  CHECK(st.core.waiting_count() == 0);
  st.feed(1, req(m_set).s("/w").s("1"));
  CHECK(st.others.empty());
}

TEST_CASE("the job's budget: a client past it is closed, the store and the others go on") {
  torch_store_limits limits;
  limits.max_total = 1000;
  limits.max_keys = 4;
  store st;
  st.core = torch_store_core{limits};
  for (uint64_t c = 1; c <= 3; ++c)
    st.core.connect(c);
  st.feed(1, validate);
  st.feed(2, validate);
  CHECK(st.feed(2, req(m_set).s("/rank0").s("addr")) == "");
  CHECK(st.core.stored_bytes() == 10);
  // A flood of distinct keys from client 1 hits the key budget.
  for (int i = 0; i < 3; ++i)
    st.feed(1, req(m_set).s("/f" + std::to_string(i)).s("x"));
  CHECK_FALSE(st.last.close);
  st.feed(1, req(m_set).s("/f3").s("x"));
  CHECK(st.last.close);
  CHECK(st.last.problem.find("over the job's torch store budget (22 bytes in 4 keys and queued "
                             "items stored; limits 1000 bytes, 4 keys)")
        != std::string::npos);
  st.core.disconnect(1);
  // Replacing and deleting keep the account: a large value replaces a small one, deleted
  // keys give their budget back, queue items count until popped.
  CHECK(st.feed(2, req(m_delete).s("/f0")) == raw<int64_t>(1));
  CHECK(st.feed(2, req(m_delete).s("/f1")) == raw<int64_t>(1));
  CHECK(st.core.stored_bytes() == 14);
  CHECK(st.feed(2, req(m_set).s("/rank0").s(std::string(900, 'a'))) == "");
  CHECK(st.core.stored_bytes() == 910);
  CHECK(st.feed(2, req(m_append).s("/rank0").s("bb")) == "");
  CHECK(st.core.stored_bytes() == 912);
  CHECK(st.feed(2, req(m_qpush).s("/q").s("item")) == "");
  CHECK(st.core.stored_bytes() == 918);
  CHECK(st.feed(2, req(m_qpop).s("/q")) == raw<int64_t>(1) + bytes("item"));
  CHECK(st.core.stored_bytes() == 912);
  // The byte budget: one more 100-byte value does not fit.
  st.feed(3, validate);
  st.feed(3, req(m_set).s("/big").s(std::string(100, 'z')));
  CHECK(st.last.close);
  CHECK(st.last.problem.find("a write to key '/big' is over the job's torch store budget")
        != std::string::npos);
  // Client 2 still works and its keys are intact.
  CHECK(st.feed(2, req(m_get).s("/f2")) == bytes("x"));
  CHECK(st.feed(2, req(m_add).s("/n").v<int64_t>(2)) == raw<int64_t>(2));
  st.core.clear();
  CHECK(st.core.stored_bytes() == 0);
  CHECK(st.feed(2, req(m_set).s("/big").s(std::string(100, 'z'))) == "");
}

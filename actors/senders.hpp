// Who sent a message: the message layer of caf-hvd's trust (DESIGN §8). CAF authenticates a
// connection and then delivers whatever it writes to any actor id it names; the wire guard
// (runtime/network/basp_guard.hpp) makes a message's sender the actor that really sent it
// (a peer's own, or none), so a handler that acts compares it with the one actor entitled
// to the message. A message without a sender can come from any peer (CAF delivers a
// remote anonymous message like a local one): an actor's own threads send as the actor
// itself (post_from), and their messages are taken only from it.
#pragma once

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include <caf/all.hpp>

namespace cafhvd {

/// Whether `sender` is the actor `h` (the same id on the same node), never when either is
/// missing.
template <class Handle> bool same_actor(const caf::strong_actor_ptr& sender, const Handle& h) {
  auto p = caf::actor_cast<caf::strong_actor_ptr>(h);
  return sender && p && caf::actor_addr::compare(sender.get(), p.get()) == 0;
}

/// Whether the message `self` handles now comes from `h`.
template <class Self, class Handle> bool sent_by(Self* self, const Handle& h) {
  return same_actor(self->current_sender(), h);
}

/// Whether the message `self` handles now comes from itself (its timers, its threads).
template <class Self> bool sent_by_itself(Self* self) {
  return same_actor(self->current_sender(), self->ctrl());
}

/// A thread of `self`'s hands it a message, as `self`.
template <class Handle, class... Ts> void post_from(const Handle& self, Ts&&... xs) {
  caf::send_as(self, self, std::forward<Ts>(xs)...);
}

/// `self` sends `dest` a message as itself where CAF's typed send() cannot (a typed actor
/// to an untyped one): the receiver sees who sent it.
template <class Self, class Dest, class... Ts> void send_from(Self* self, const Dest& dest, Ts&&... xs) {
  caf::unsafe_send_as(self, dest, std::forward<Ts>(xs)...);
}

/// Messages refused for their sender in this process so far.
inline std::atomic<uint64_t> refused_messages{0};

/// Refused messages so far, per peer: the certificate of the sender's node ("'CN'
/// (role)"), "no sender" (a peer's anonymous message looks like a local one) or "this
/// process".
std::map<std::string, uint64_t> refused_by_peer();

/// Called for each refused message, on the refusing actor's thread: the peer (as above),
/// what was refused, and that peer's refusals so far. One listener a process (the
/// driver's event log); it must not block.
using refused_listener =
    std::function<void(const std::string& peer, const std::string& what, uint64_t count)>;
void on_refused_message(refused_listener listener);

/// Counts a refused message and says so on stderr (at most 20 lines a minute).
void note_refused(caf::local_actor* self, const char* who, const std::string& what);

/// `ok`, and when it is false the refusal counted and said (note_refused).
inline bool admitted(caf::local_actor* self, bool ok, const char* who, const std::string& what) {
  if (!ok)
    note_refused(self, who, what);
  return ok;
}

/// The default handler of actors that peers can reach: a message of no type it takes is
/// dropped and counted (CAF's default prints each one: a peer could fill the log).
caf::result<caf::message> drop_unexpected(caf::scheduled_actor* self, caf::message_view& x);

/// The error a refused request is answered with.
caf::error refused_error(const std::string& what);

} // namespace cafhvd

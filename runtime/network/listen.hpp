// Opening a listening TCP socket on an Asio acceptor, as every server of the job does
// (rendezvous server, torch store, dashboard): open, SO_REUSEADDR, bind, listen.
#pragma once

#include <cstdint>

#include <boost/asio/ip/tcp.hpp>
#include <boost/system/error_code.hpp>

namespace cafhvd {

/// Opens `acceptor` listening on address:port (port 0 = a free one); the first error, if
/// any (the caller names the server and the address in its message).
inline boost::system::error_code listen_on(boost::asio::ip::tcp::acceptor& acceptor,
                                           const boost::asio::ip::address& address,
                                           uint16_t port, int backlog) {
  boost::system::error_code ec;
  boost::asio::ip::tcp::endpoint ep{address, port};
  acceptor.open(ep.protocol(), ec);
  if (!ec)
    acceptor.set_option(boost::asio::socket_base::reuse_address(true), ec);
  if (!ec)
    acceptor.bind(ep, ec);
  if (!ec)
    acceptor.listen(backlog, ec);
  return ec;
}

} // namespace cafhvd

// How a link's state turns into errors: a broken link's exception, a frame that does not fit its receive, and the
// durations in messages about links.
#include "core/comm/tcp/link.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <sstream>

#include "core/comm/transport.h"
#include "core/common/error.h"

namespace terse::comm::tcp {

Link::~Link() {
  if (wake_fd >= 0) ::close(wake_fd);
}

void Link::kickReader() const {
  // A full counter (it never is: the reader drains it) only means a wake-up is already pending.
  if (wake_fd >= 0) (void)::eventfd_write(wake_fd, 1);
}

IoResult recvSome(int fd, void* data, std::size_t size) {
  IoResult r;
  for (;;) {
    const ssize_t n = ::recv(fd, data, size, MSG_DONTWAIT);
    if (n >= 0) {
      r.n = n;
      return r;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      r.would_block = true;
    } else {
      r.error = boost::system::error_code(errno, boost::system::system_category());
    }
    return r;
  }
}

void throwBroken(const Link& l) {
  if (l.broken_by_payload) throw InvalidPayload(l.broken);
  throw CommError(l.broken);
}

std::string mismatch(const Link& l, const FrameHeader& h, const RecvOp& r) {
  std::ostringstream m;
  if (h.meta.kind != r.expect.kind) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (tag 0x" << std::hex << h.meta.tag << std::dec
      << ") belongs to a " << opKindName(h.meta.kind) << " operation, the receive expected "
      << opKindName(r.expect.kind) << " (two operations share a tag)";
  } else if (r.reduce && h.length % dtypeSize(r.dtype) != 0) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (" << opKindName(h.meta.kind) << ") carries "
      << h.length << " bytes, not a whole number of " << dtypeName(r.dtype) << " elements to add";
  } else if (h.length > r.buffer.size()) {
    m << detail::where(__FILE__, __LINE__) << "frame from " << l.who << " (" << opKindName(h.meta.kind) << ", tag 0x"
      << std::hex << h.meta.tag << std::dec << ") carries " << h.length << " bytes, the receive buffer holds "
      << r.buffer.size();
  }
  return m.str();
}

std::string secondsText(Clock::duration d) {
  std::ostringstream o;
  o.precision(3);
  o << std::chrono::duration<double>(d).count() << " s";
  return o.str();
}

}  // namespace terse::comm::tcp

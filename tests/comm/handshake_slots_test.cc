// The table of unauthenticated connections (core/comm/handshake_slots.h): a newcomer is always admitted; the victim is
// the oldest silent connection of its source (at the per-source bound) or of all (at the total bound), and one that
// sent a valid hello goes only when no silent one is left.
#include "core/comm/handshake_slots.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/common/error.h"

namespace terse::comm {
namespace {

struct Recorder {
  std::vector<int> evicted;
  HandshakeSlots::Evict of(int id) {
    return [this, id] { evicted.push_back(id); };
  }
};

TEST(HandshakeSlots, TheOldestOfASourceAtItsBoundIsEvicted) {
  HandshakeSlots slots(8, 3);
  Recorder rec;
  for (int i = 0; i < 3; ++i) slots.admit("10.0.0.1", rec.of(i));
  slots.admit("10.0.0.2", rec.of(100));
  EXPECT_TRUE(rec.evicted.empty());
  slots.admit("10.0.0.1", rec.of(3));
  EXPECT_EQ(rec.evicted, std::vector<int>{0});
  EXPECT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots.evictions(), 1u);
}

TEST(HandshakeSlots, TheOldestOfAllIsEvictedWhenTheTableIsFull) {
  HandshakeSlots slots(4, 4);
  Recorder rec;
  slots.admit("a", rec.of(0));
  slots.admit("b", rec.of(1));
  slots.admit("c", rec.of(2));
  slots.admit("d", rec.of(3));
  slots.admit("e", rec.of(4));
  EXPECT_EQ(rec.evicted, std::vector<int>{0});
  EXPECT_EQ(slots.size(), 4u);
}

TEST(HandshakeSlots, SilentConnectionsGoBeforeOnesThatSentAHello) {
  HandshakeSlots slots(4, 4);
  Recorder rec;
  const auto peer = slots.admit("h", rec.of(0));  // the real peer: oldest, but it sent its hello
  slots.progressed(peer);
  for (int i = 1; i < 4; ++i) slots.admit("h", rec.of(i));
  for (int i = 4; i < 100; ++i) slots.admit("h", rec.of(i));  // an idle flood, renewed
  EXPECT_EQ(rec.evicted.size(), 96u);
  for (int id : rec.evicted) EXPECT_NE(id, 0);
  // Once every entry sent a hello, the oldest of them goes.
  HandshakeSlots full(2, 2);
  Recorder rec2;
  full.progressed(full.admit("h", rec2.of(0)));
  full.progressed(full.admit("h", rec2.of(1)));
  full.admit("h", rec2.of(2));
  EXPECT_EQ(rec2.evicted, std::vector<int>{0});
}

TEST(HandshakeSlots, ReleasedAndEvictedTicketsAreForgotten) {
  HandshakeSlots slots(2, 2);
  Recorder rec;
  const auto a = slots.admit("h", rec.of(0));
  const auto b = slots.admit("h", rec.of(1));
  slots.release(a);
  slots.release(a);  // twice: ignored
  EXPECT_EQ(slots.size(), 1u);
  slots.admit("h", rec.of(2));
  slots.admit("h", rec.of(3));  // evicts b
  EXPECT_EQ(rec.evicted, std::vector<int>{1});
  slots.release(b);  // the evicted connection's handlers release it again: ignored
  slots.progressed(b);
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_THROW(HandshakeSlots(2, 3), InvalidArgument);
  EXPECT_THROW(HandshakeSlots(0, 0), InvalidArgument);
}

}  // namespace
}  // namespace terse::comm

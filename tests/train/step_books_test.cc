// The group scheduler's books of a step (core/train/step_books.h): a new step starts them afresh and only a new one
// does, the step's last admission is told, a tensor joins the issue order at its first chunk only, a group reports
// the tensors whose last chunk it held, in its chunks' order, and the groups handed out are kept until the next step.
#include "core/train/step_books.h"

#include <gtest/gtest.h>

#include <vector>

namespace terse::train {
namespace {

Chunk chunkOf(uint64_t tensor, int index) {
  Chunk c;
  c.tensor_id = tensor;
  c.chunk_index = index;
  return c;
}

TEST(StepBooks, ANewStepStartsAfreshAndOnlyANewOne) {
  StepBooks books(3);
  EXPECT_EQ(books.step(), -1);
  EXPECT_TRUE(books.begin(0, 0.5));
  EXPECT_EQ(books.step(), 0);
  EXPECT_EQ(books.lr(), 0.5);
  EXPECT_TRUE(books.start(2));
  IssuedGroup g;
  g.wire_bytes = 7;
  books.issued(g);
  EXPECT_FALSE(books.admitted());
  EXPECT_FALSE(books.begin(0, 0.25)) << "the same step started the books again";
  EXPECT_EQ(books.lr(), 0.5);
  EXPECT_FALSE(books.admitted());
  EXPECT_TRUE(books.admitted()) << "the third of three tensors was not the step's last";
  EXPECT_EQ(books.issueOrder(), (std::vector<std::size_t>{2}));
  ASSERT_EQ(books.groups().size(), 1u);
  EXPECT_EQ(books.groups()[0].wire_bytes, 7u);

  EXPECT_TRUE(books.begin(1, 0.25));
  EXPECT_EQ(books.lr(), 0.25);
  EXPECT_TRUE(books.issueOrder().empty());
  EXPECT_TRUE(books.groups().empty());
  EXPECT_TRUE(books.start(2)) << "a tensor started last step did not start again";

  // A step left with one of two admissions counted (a failed run's last step): the next one counts from none.
  StepBooks two(2);
  two.begin(0, 0.1);
  EXPECT_FALSE(two.admitted());
  two.begin(1, 0.1);
  EXPECT_FALSE(two.admitted()) << "the admissions of the step before were still counted";
  EXPECT_TRUE(two.admitted());
}

TEST(StepBooks, ATensorJoinsTheIssueOrderAtItsFirstChunk) {
  StepBooks books(4);
  books.begin(3, 0.1);
  EXPECT_TRUE(books.start(1));
  EXPECT_TRUE(books.start(3));
  EXPECT_FALSE(books.start(1));
  EXPECT_TRUE(books.start(0));
  EXPECT_EQ(books.issueOrder(), (std::vector<std::size_t>{1, 3, 0}));
}

TEST(StepBooks, AGroupReportsTheTensorsWhoseLastChunkItHeld) {
  StepBooks books(3);
  books.begin(0, 0.1);
  books.expect(0, 1);
  books.expect(1, 3);
  books.expect(2, 2);
  // Tensor 1 in three chunks over three groups, tensor 2 in two, tensor 0 whole.
  const std::vector<Chunk> first = {chunkOf(1, 0), chunkOf(2, 0)};
  const std::vector<Chunk> second = {chunkOf(2, 1), chunkOf(0, 0), chunkOf(1, 1)};
  const std::vector<Chunk> third = {chunkOf(1, 2)};
  EXPECT_TRUE(books.finish(first).empty());
  EXPECT_EQ(books.finish(second), (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(books.finish(third), (std::vector<std::size_t>{1}));
}

}  // namespace
}  // namespace terse::train

// AlgorithmChoice (core/ops/cuda/algorithm_choice.h): the order in which a cuBLASLt plan
// tries its candidate algorithms, and what it remembers between calls. Backend-independent,
// so checked here with attempts that accept or refuse by index.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "core/ops/cuda/algorithm_choice.h"

namespace mantissa::core {
namespace {

// Runs the choice once; `runs` are the candidates that would run. Returns the tried indices.
std::vector<int> tried_by(AlgorithmChoice& choice, const std::set<int>& runs, int* ran) {
  std::vector<int> tried;
  *ran = choice.run([&](int i) {
    tried.push_back(i);
    return runs.count(i) != 0;
  });
  return tried;
}

TEST(AlgorithmChoice, TheBestCandidateRunsFirstAndStays) {
  AlgorithmChoice choice(8);
  int ran = -2;
  EXPECT_EQ(tried_by(choice, {0, 1, 2}, &ran), std::vector<int>({0}));
  EXPECT_EQ(ran, 0);
  EXPECT_EQ(tried_by(choice, {0, 1, 2}, &ran), std::vector<int>({0}));
  EXPECT_EQ(choice.preferred(), 0);
}

TEST(AlgorithmChoice, RefusedCandidatesFallBackInOrderAndTheOneThatRanIsRemembered) {
  AlgorithmChoice choice(5);
  int ran = -2;
  EXPECT_EQ(tried_by(choice, {2, 4}, &ran), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(choice.preferred(), 2);
  // The next call of the same plan goes straight to it.
  EXPECT_EQ(tried_by(choice, {2, 4}, &ran), std::vector<int>({2}));
  EXPECT_EQ(ran, 2);
}

TEST(AlgorithmChoice, WhenThePreferredOneIsRefusedTheOthersFollowInTheHeuristicsOrder) {
  AlgorithmChoice choice(5);
  int ran = -2;
  tried_by(choice, {2}, &ran);
  ASSERT_EQ(choice.preferred(), 2);
  EXPECT_EQ(tried_by(choice, {4}, &ran), std::vector<int>({2, 0, 1, 3, 4}));
  EXPECT_EQ(ran, 4);
  EXPECT_EQ(choice.preferred(), 4);
  EXPECT_FALSE(choice.exhausted());
}

TEST(AlgorithmChoice, APlanWhoseCandidatesAllFailIsRememberedAndNotRetried) {
  AlgorithmChoice choice(3);
  int ran = -2;
  EXPECT_EQ(tried_by(choice, {}, &ran), std::vector<int>({0, 1, 2}));
  EXPECT_EQ(ran, -1);
  EXPECT_TRUE(choice.exhausted());
  EXPECT_TRUE(tried_by(choice, {0, 1, 2}, &ran).empty());
  EXPECT_EQ(ran, -1);
}

TEST(AlgorithmChoice, AFailureThatIsNoRefusalPropagatesAndChangesNothing) {
  AlgorithmChoice choice(4);
  int ran = -2;
  tried_by(choice, {1}, &ran);
  ASSERT_EQ(choice.preferred(), 1);
  EXPECT_THROW(choice.run([](int i) -> bool { throw i; }), int);
  EXPECT_FALSE(choice.exhausted());
  EXPECT_EQ(choice.preferred(), 1);
  EXPECT_EQ(tried_by(choice, {1}, &ran), std::vector<int>({1}));
}

TEST(AlgorithmChoice, NoCandidatesMeansNothingRuns) {
  AlgorithmChoice choice(0);
  EXPECT_TRUE(choice.exhausted());
  int ran = -2;
  EXPECT_TRUE(tried_by(choice, {0}, &ran).empty());
  EXPECT_EQ(ran, -1);
}

}  // namespace
}  // namespace mantissa::core

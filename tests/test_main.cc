// main() of every gtest binary: exit 77 (SKIP to ctest) when everything was skipped.
#include <gtest/gtest.h>

#include "test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return sluice::testing::run_all_tests_skip_aware();
}

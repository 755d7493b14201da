// The commit this build of terse was made from, which a results folder's provenance.json records as git_commit (the
// CLI's runs, calibration tables, the Python package's ResultsLogger). Taken when the code is built, not when it runs:
// the target terse_build_commit (results/CMakeLists.txt) runs cmake/build_commit.cmake at every build, which rewrites
// the generated definition only when HEAD or the tree's dirtiness changed. At run time git would answer for whatever
// checkout is nearby -- an installed terse run inside a user's own repository recorded that repository's HEAD, and a
// build-tree binary run after a `git checkout` without a rebuild recorded the new HEAD, not the code that ran.
//
// scripts/gpu-kit builds the extension from the kit's static libraries, among them terse_results with this definition:
// a kit's extension records the commit of the build the kit was packed from, whose sources the kit's manifest holds
// the GPU machine's tree to.
#pragma once

#include <string_view>

namespace terse::results {

// "<40 hex digits>" (HEAD of the source tree's checkout), with "-dirty" when tracked files had uncommitted changes at
// build time; "unknown" when the source tree was not the top of a git checkout of its own (an unpacked archive, even
// one inside another repository) or git was missing.
std::string_view buildCommit();

}  // namespace terse::results

// A rank for the launcher's control-channel cases (core/common/launch_notify.h): it says what the test asks on the
// channel `terse launch` gave it, through the same calls the runner and the crash handler use, then ends as asked.
//   notify_probe [R:ACTION[,ACTION...]]...    rank R's actions, in order; a rank without any exits 0
// Actions: done (says study-done), fail=TEXT (says "failed TEXT"), crash (says "crashed SIGSEGV plugin=hang-decomp
// path=/plugins/lib hang.so" and dies of SIGSEGV, without a core file), stop (SIGSTOPs itself), sleep (sleeps until
// killed), exit=C (exits with status C).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>

#include "core/common/launch_notify.h"

int main(int argc, char** argv) {
  const char* rank_text = std::getenv("TERSE_RANK");
  const std::string me = std::string(rank_text ? rank_text : "0") + ":";
  std::cout << "notify probe rank " << (rank_text ? rank_text : "0") << ": channel "
            << (terse::launcherNotifyEnabled() ? "on" : "off") << std::endl;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.starts_with(me)) continue;
    std::istringstream actions(arg.substr(me.size()));
    for (std::string a; std::getline(actions, a, ',');) {
      if (a == "done") {
        terse::notifyLauncher("study-done");
      } else if (a.starts_with("fail=")) {
        terse::notifyLauncherParts({"failed ", a.substr(5)});
      } else if (a == "crash") {
        const rlimit no_core{0, 0};
        ::setrlimit(RLIMIT_CORE, &no_core);
        terse::notifyLauncherParts(
            {"crashed ", "SIGSEGV", " plugin=", "hang-decomp", " path=", "/plugins/lib hang.so"});
        ::raise(SIGSEGV);
      } else if (a == "stop") {
        ::raise(SIGSTOP);
      } else if (a == "sleep") {
        for (;;) ::pause();
      } else if (a.starts_with("exit=")) {
        return std::atoi(a.c_str() + 5);
      } else {
        std::cerr << "notify probe: unknown action '" << a << "'\n";
        return 2;
      }
    }
  }
  return 0;
}

/* fp-agent: one static binary, several roles.
 *   shim -- CMD...   host side: subreaper that outlives CMD and reaps the sandbox it leaves
 *   spawner SOCKET   host side: starts shims and commands for the server (spawner.c)
 *   boot OPTIONS     host side: builds the sandbox's namespaces and root, then execs init
 *   init             inside the sandbox: PID 1, the agent
 *   criu-run         host side: CRIU with its kernel-probe cache on a private /run, in the
 *                    sandbox's netns or a fresh one; with --swrk, a warm RPC worker
 *   mount-overlay, umount, syncfs   host side: the syscalls, without util-linux's start-up
 *   mkdev DIR        host side: the device nodes of the agent layer's /dev
 *   net-setup PID HOSTIF ADDR GW MAC   host side: a booted sandbox's network link
 *   wp-hold SOCKET PID   host side: keeps a sandbox's dirty-page tracking (wp_hold.c)
 *   pages-flatten DIR PARENT   host side: an incremental memory image made whole */
#include <stdio.h>
#include <string.h>

#include "fp.h"

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "init")) return agent_main();
  if (argc >= 2 && !strcmp(argv[1], "boot")) return boot_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "shim")) return shim_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "spawner")) return spawner_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "criu-run")) return criu_run_main(argc - 1, argv + 1);
  if (argc >= 2 && (!strcmp(argv[1], "mount-overlay") || !strcmp(argv[1], "umount")))
    return overlay_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "volume-files")) return volume_files_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "syncfs")) return syncfs_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "fhpath")) return fhpath_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "mkdev")) return mkdev_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "net-setup")) return net_setup_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "wp-hold")) return wp_hold_main(argc - 1, argv + 1);
  if (argc >= 2 && !strcmp(argv[1], "pages-flatten")) return pages_flatten_main(argc - 1, argv + 1);
  fprintf(stderr, "usage: fp-agent init | boot OPTIONS | shim --status FILE -- CMD... | criu-run --cache DIR -- CRIU...\n");
  return 2;
}

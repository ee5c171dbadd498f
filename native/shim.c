/* fp-agent shim: the parent of one sandbox, like conmon or containerd-shim.
 *
 * The machine's PID 1 may not reap orphans, and Node cannot make itself a subreaper, so each
 * sandbox gets this small process: it becomes a child subreaper, runs CMD (a boot, or a CRIU
 * worker that restores), adopts the sandbox's PID 1 when CMD exits, and reaps it when the
 * sandbox dies, writing the last exit status to --status. It exits when it has no children.
 * With --exit-file, CMD's own exit code goes to that file once CMD ends: a daemon's (a lazy-pages
 * daemon), for a server that was not there to read it from the shim. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp.h"

/* How the shim tells the engine that CMD is done: a line "exit N", or with --exit-frame (stdout
 * is then a connection that carries CMD's frames too, spawner.c) an 'X' frame, N as i32 LE. */
static int exit_as_frame;

static void report_exit(int code) {
  if (!exit_as_frame) {
    printf("exit %d\n", code);
    fflush(stdout);
    return;
  }
  uint8_t f[9] = {5, 0, 0, 0, 'X'};
  for (int k = 0; k < 4; k++) f[5 + k] = (uint8_t)((uint32_t)code >> (8 * k));
  write_full(1, f, sizeof(f));
}

/* CODE into FILE, whole or not at all (written aside, then renamed). */
static void write_exit_file(const char *file, int code) {
  char tmp[4096], line[16];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp", file) >= (int)sizeof(tmp)) return;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  int n = snprintf(line, sizeof(line), "%d\n", code);
  int ok = write(fd, line, (size_t)n) == n;
  close(fd);
  if (ok) rename(tmp, file);
}

int shim_main(int argc, char **argv) {
  const char *status_file = NULL, *exit_file = NULL;
  int i = 1;
  for (; i < argc; i++) {
    if (!strcmp(argv[i], "--exit-frame")) exit_as_frame = 1;
    else if (!strcmp(argv[i], "--status") && i + 1 < argc) status_file = argv[++i];
    else if (!strcmp(argv[i], "--exit-file") && i + 1 < argc) exit_file = argv[++i];
    else if (!strcmp(argv[i], "--cgroup-procs") && i + 1 < argc) i++;
    else if (!strcmp(argv[i], "--")) { i++; break; }
  }
  if (i >= argc) {
    fprintf(stderr, "shim: no command\n");
    return 2;
  }
  /* Joined before anything is forked, so the whole sandbox is born inside its limits. */
  for (int k = 1; k < i; k++) {
    if (strcmp(argv[k], "--cgroup-procs") || k + 1 >= i) continue;
    char self[32];
    snprintf(self, sizeof(self), "%d", getpid());
    int fd = open(argv[k + 1], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, self, strlen(self)) < 0) {
      fprintf(stderr, "shim: join cgroup %s: %s\n", argv[k + 1], strerror(errno));
      report_exit(1);
      return 1;
    }
    close(fd);
  }
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  setsid();
  pid_t cmd = fork();
  if (cmd < 0) return 1;
  if (cmd == 0) {
    /* Its stdout is not the connection: only its frames (fd 3) and the shim's exit go there. */
    if (exit_as_frame) {
      int null = open("/dev/null", O_WRONLY);
      if (null >= 0) dup2(null, 1);
    }
    execvp(argv[i], argv + i);
    perror("shim: exec");
    _exit(127);
  }
  /* The shim keeps no reference to the host's terminal or pipes once CMD has them. */
  int devnull = open("/dev/null", O_RDWR);
  int cmd_status = -1, last_status = 0;
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == cmd) {
      cmd_status = st;
      int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (exit_file) write_exit_file(exit_file, code);
      /* The engine reads this (a line, or a frame) to learn that the boot or restore is over. */
      report_exit(code);
      if (devnull >= 0) dup2(devnull, 0), dup2(devnull, 1), dup2(devnull, 2);
      /* and no other pipe to the engine either (fd 3 carries a CRIU worker's answers) */
      closefrom(3);
    } else {
      last_status = st;
    }
  }
  if (status_file) {
    FILE *f = fopen(status_file, "w");
    if (f) {
      int code = WIFEXITED(last_status) ? WEXITSTATUS(last_status) : 128 + WTERMSIG(last_status);
      fprintf(f, "%d\n", code);
      fclose(f);
    }
  }
  return cmd_status >= 0 && WIFEXITED(cmd_status) ? WEXITSTATUS(cmd_status) : 1;
}

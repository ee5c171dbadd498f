/* fp-agent spawner SOCKET: starts the engine's processes for it.
 *
 * Node starts a child by fork()ing itself, and the fork copies the page tables of a server
 * holding hundreds of MB: 5-12 ms per spawn here, all of it on the event loop every request
 * shares (a fork's CRIU worker, each umount and nft). This small process forks instead, in
 * ~0.1 ms. It listens on SOCKET (in a directory only root can enter) and takes connections only
 * from its parent, the server; each connection asks for one process, in one frame (a u32
 * little-endian length, a kind byte, then NUL-separated fields):
 *   'S' LOGFILE\0ARGV...   a shim (or anything speaking frames): its stdin, stdout and fd 3 are
 *                          the connection, stderr appends to LOGFILE; in a session of its own.
 *   'C' CWD\0ARGV...       a command run to completion (run.ts): no stdin or stdout; the answer
 *                          is one 'X' frame, its exit code (i32 LE, 128+N for signal N) and up
 *                          to 64 KiB of its stderr.
 *   'I' CWD\0ARGV...       as 'C', its stdin what the server writes on the connection after the
 *                          request, up to its end (shutdown): `nft -f -` fed a script.
 *   'O' CWD\0ARGV...       as 'C', but the 'X' frame carries up to 64 KiB of its stdout, and its
 *                          stderr goes nowhere: `du`, `find`.
 * Killing the pid of the 'P' frame of an 'I' or 'O' (the waiter's) kills the command too.
 * Each is answered first with a 'P' frame, the child's pid in decimal, before the child writes
 * anything to the connection. A child that cannot exec writes an 'X' frame with 127 and why.
 * The spawner dies with the server (PR_SET_PDEATHSIG); what it started does not. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fp.h"

#define MAX_REQUEST (64 * 1024)
#define MAX_ARGS 512
#define MAX_STDERR (64 * 1024)

static int frame(int fd, char kind, const void *data, size_t len) {
  uint8_t head[5];
  uint32_t n = (uint32_t)len + 1;
  for (int k = 0; k < 4; k++) head[k] = (uint8_t)(n >> (8 * k));
  head[4] = (uint8_t)kind;
  return write_full(fd, head, 5) < 0 || (len && write_full(fd, data, len) < 0) ? -1 : 0;
}

static void exit_frame(int fd, int code, const char *text, size_t len) {
  char buf[4 + MAX_STDERR];
  if (len > MAX_STDERR) len = MAX_STDERR;
  for (int k = 0; k < 4; k++) buf[k] = (char)((uint32_t)code >> (8 * k));
  memcpy(buf + 4, text, len);
  frame(fd, 'X', buf, 4 + len);
}

static void reap(int sig) {
  (void)sig;
  int saved = errno;
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
  errno = saved;
}

/* The child's signal state as a fresh process's: the spawner's SIGCHLD handler must not reap
 * a shim's or a command's own children. */
static void reset_signals(void) {
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  prctl(PR_SET_PDEATHSIG, 0);
}

/* 'C': runs ARGV in CWD, keeps its stderr, answers with its exit. 'I': its stdin the
 * connection. 'O': keeps its stdout instead. */
static void run_command(int conn, const char *cwd, char **argv, char kind) {
  int input = kind == 'I', output = kind == 'O';
  int err[2];
  if (pipe2(err, O_CLOEXEC) < 0) {
    exit_frame(conn, 127, strerror(errno), strlen(strerror(errno)));
    _exit(0);
  }
  pid_t waiter = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(input ? conn : null, 0) < 0 || dup2(output ? err[1] : null, 1) < 0 || dup2(output ? null : err[1], 2) < 0) _exit(127);
    /* The server ends such a command (past its deadline) by the pid of the 'P' frame, this
     * waiter's: the command goes with it. */
    if ((input || output) && (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != waiter)) _exit(127);
    if (cwd[0] && chdir(cwd) < 0) {
      fprintf(stderr, "chdir %s: %s\n", cwd, strerror(errno));
      _exit(127);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "%s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(err[1]);
  static char text[MAX_STDERR];
  size_t len = 0;
  for (;;) {
    char chunk[4096];
    ssize_t n = read(err[0], chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    size_t room = MAX_STDERR - len, take = (size_t)n < room ? (size_t)n : room;
    memcpy(text + len, chunk, take);
    len += take;
  }
  int st = 0, code = 127;
  if (pid > 0) {
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  } else {
    len = (size_t)snprintf(text, sizeof(text), "fork: %s", strerror(errno));
  }
  exit_frame(conn, code, text, len);
  _exit(0);
}

/* 'S': a shim, its stdio the connection (stderr its log). */
static void exec_shim(int conn, const char *logfile, char **argv) {
  int log = open(logfile, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (log < 0 || dup2(conn, 0) < 0 || dup2(conn, 1) < 0 || dup2(log, 2) < 0 || dup2(conn, 3) < 0) {
    const char *why = strerror(errno);
    exit_frame(conn, 127, why, strlen(why));
    _exit(127);
  }
  setsid();
  execv(argv[0], argv);
  const char *why = strerror(errno);
  exit_frame(3, 127, why, strlen(why));
  _exit(127);
}

static void serve_one(int conn) {
  static char req[MAX_REQUEST + 1];
  uint8_t head[4];
  if (read_full(conn, head, 4) < 0) return;
  uint32_t n = head[0] | head[1] << 8 | head[2] << 16 | (uint32_t)head[3] << 24;
  if (n < 2 || n > MAX_REQUEST || read_full(conn, req, n) < 0) return;
  req[n] = 0;
  char kind = req[0];
  /* Fields: the first (LOGFILE or CWD), then ARGV; buf[n] is a NUL, so each strlen stays inside. */
  const char *first = req + 1;
  char *argv[MAX_ARGS + 1];
  int argc = 0;
  for (char *p = req + 1 + strlen(first) + 1; p < req + n && argc < MAX_ARGS; p += strlen(p) + 1) argv[argc++] = p;
  argv[argc] = NULL;
  if ((kind != 'S' && kind != 'C' && kind != 'I' && kind != 'O') || argc == 0) {
    exit_frame(conn, 127, "bad request", 11);
    return;
  }
  int gate[2];
  if (pipe2(gate, O_CLOEXEC) < 0) {
    exit_frame(conn, 127, "pipe", 4);
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    reset_signals();
    close(gate[1]);
    char ignored;
    /* Until the 'P' frame is written: nothing of the child's may come before it. */
    while (read(gate[0], &ignored, 1) < 0 && errno == EINTR) {}
    close(gate[0]);
    if (kind == 'S') exec_shim(conn, first, argv);
    run_command(conn, first, argv, kind);
  }
  close(gate[0]);
  if (pid < 0) {
    exit_frame(conn, 127, "fork", 4);
  } else {
    char text[24];
    int len = snprintf(text, sizeof(text), "%d", (int)pid);
    frame(conn, 'P', text, (size_t)len);
  }
  close(gate[1]);
}

int spawner_main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: fp-agent spawner SOCKET\n");
    return 2;
  }
  pid_t server = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != server) return 1; /* the server died before the line above */
  struct sigaction sa = {0};
  sa.sa_handler = reap;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(argv[1]) >= sizeof(addr.sun_path)) {
    fprintf(stderr, "spawner: socket path too long\n");
    return 1;
  }
  strcpy(addr.sun_path, argv[1]);
  unlink(argv[1]);
  int sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  mode_t umask_was = umask(077); /* the socket is the server's alone; what is started keeps its umask */
  int bound = sk >= 0 && bind(sk, (struct sockaddr *)&addr, sizeof(addr)) == 0;
  umask(umask_was);
  if (!bound || listen(sk, 128) < 0) {
    perror("spawner: listen");
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    int conn = accept4(sk, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      perror("spawner: accept");
      return 1;
    }
    /* Only the server: a process of the host that reached the socket anyway gets nothing. */
    struct ucred peer;
    socklen_t len = sizeof(peer);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 && peer.pid == server && peer.uid == getuid()) serve_one(conn);
    close(conn);
  }
}

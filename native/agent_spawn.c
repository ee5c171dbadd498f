/* Starting a process for a spawn frame: its strings checked against the frame's length, then a
 * PTY or three pipes, and a child that execs the command or tells why it could not. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "agent.h"

void spawn_request_free(struct spawn_request *r) {
  free(r->strs), free(r->envp), free(r->argv);
  r->strs = r->envp = r->argv = NULL;
}

int spawn_parse(const struct fp_header *h, char *pl, struct spawn_request *r, const char **why) {
  memset(r, 0, sizeof(*r));
  if (h->len < 8) return *why = "short spawn", EINVAL;
  uint16_t argc, envc;
  memcpy(&r->rows, pl, 2), memcpy(&r->cols, pl + 2, 2), memcpy(&argc, pl + 4, 2), memcpy(&envc, pl + 6, 2);
  if (argc == 0 || argc > 4096 || envc > 4096) return *why = "bad argc/envc", EINVAL;
  r->pty = (h->flags & FP_SPAWN_PTY) != 0;
  r->noecho = (h->flags & FP_SPAWN_NOECHO) != 0;
  r->strs = calloc((size_t)argc + envc + 3, sizeof(char *));
  r->envp = calloc((size_t)envc + 1, sizeof(char *));
  r->argv = calloc((size_t)argc + 1, sizeof(char *));
  if (!r->strs || !r->envp || !r->argv) return spawn_request_free(r), *why = "no memory", ENOMEM;
  /* cwd, argv..., envp...: each NUL-terminated inside the frame */
  char *cur = pl + 8, *end = pl + h->len;
  int need = 1 + argc + envc;
  for (int i = 0; i < need; i++) {
    char *z = memchr(cur, 0, (size_t)(end - cur));
    if (!z) return spawn_request_free(r), *why = "unterminated string", EINVAL;
    r->strs[i] = cur;
    cur = z + 1;
  }
  r->cwd = r->strs[0];
  for (int i = 0; i < argc; i++) r->argv[i] = r->strs[1 + i];
  for (int i = 0; i < envc; i++) r->envp[i] = r->strs[1 + argc + i];
  return 0;
}

static const char *path_lookup(const char *file, char *const env[], char *out, size_t outsz) {
  if (strchr(file, '/')) return file;
  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (int i = 0; env[i]; i++)
    if (!strncmp(env[i], "PATH=", 5)) path = env[i] + 5;
  while (*path) {
    const char *end = strchrnul(path, ':');
    snprintf(out, outsz, "%.*s/%s", (int)(end - path), path, file);
    if (access(out, X_OK) == 0) return out;
    path = *end ? end + 1 : end;
  }
  return file;
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* In the child: its own session, stdio on the PTY or the pipes, then exec. A failure goes to
 * the parent as an errno on `report` (close-on-exec: a successful exec closes it unwritten). */
static void exec_child(const struct spawn_request *r, int slave, const int in[2], const int out[2], const int err[2], int report) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  setsid();
  int oom = open("/proc/self/oom_score_adj", O_WRONLY);
  if (oom >= 0) {
    if (write(oom, "0", 1) < 0) {}
    close(oom);
  }
  if (r->pty) {
    ioctl(slave, TIOCSCTTY, 0);
    dup2(slave, 0), dup2(slave, 1), dup2(slave, 2);
  } else {
    dup2(in[0], 0), dup2(out[1], 1), dup2(err[1], 2);
  }
  if (r->ids) {
    /* The terminal becomes the user's, as login(1) makes it: tools that check their tty (sudo,
     * ssh, mesg) find it theirs. */
    if (r->pty && fchown(0, r->ids->uid, (gid_t)-1) < 0) {}
    int e = ids_become(r->ids);
    if (e) {
      if (write(report, &e, sizeof(e))) {}
      _exit(127);
    }
  }
  if (r->cwd[0] && chdir(r->cwd) < 0) {
    int e = errno;
    if (write(report, &e, sizeof(e))) {}
    _exit(127);
  }
  char pathbuf[4096];
  execve(path_lookup(r->argv[0], r->envp, pathbuf, sizeof(pathbuf)), r->argv, r->envp);
  int e = errno;
  if (write(report, &e, sizeof(e))) {}
  _exit(127);
}

int spawn_start(const struct spawn_request *r, struct spawned *s, char *msg, size_t msgsz) {
  int pty = -1, slave = -1, inp[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, report[2] = {-1, -1};
  int e = 0;
  if (r->pty) {
    pty = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (pty < 0 || grantpt(pty) < 0 || unlockpt(pty) < 0) goto fail_errno;
    slave = open(ptsname(pty), O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (slave < 0) goto fail_errno;
    struct winsize ws = {.ws_row = r->rows ? r->rows : 24, .ws_col = r->cols ? r->cols : 80};
    ioctl(pty, TIOCSWINSZ, &ws);
    if (r->noecho) {
      struct termios t;
      tcgetattr(slave, &t);
      t.c_lflag &= ~(tcflag_t)(ECHO | ECHOE | ECHOK | ECHONL);
      tcsetattr(slave, TCSANOW, &t);
    }
  } else if (pipe2(inp, O_CLOEXEC) < 0 || pipe2(outp, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) {
    goto fail_errno;
  }
  if (pipe2(report, O_CLOEXEC) < 0) goto fail_errno;

  pid_t pid = fork();
  if (pid < 0) goto fail_errno;
  if (pid == 0) exec_child(r, slave, inp, outp, errp, report[1]);
  close(report[1]), report[1] = -1;
  int child_err = 0;
  ssize_t n;
  while ((n = read(report[0], &child_err, sizeof(child_err))) < 0 && errno == EINTR) {}
  close(report[0]), report[0] = -1;
  if (n == sizeof(child_err)) {
    /* exec failed: the child exits 127 and is reaped later as an unknown pid */
    e = child_err;
    snprintf(msg, msgsz, "cannot start: %s", strerror(e));
    goto fail;
  }
  s->pid = pid;
  s->pty = pty;
  s->pty_slave = slave;
  s->in_fd = s->out_fd = s->err_fd = -1;
  if (pty >= 0) {
    set_nonblock(pty);
  } else {
    close(inp[0]), close(outp[1]), close(errp[1]);
    s->in_fd = inp[1], s->out_fd = outp[0], s->err_fd = errp[0];
    /* stdin too: the agent writes what the process reads, never waiting for it (agent.c). */
    set_nonblock(s->in_fd), set_nonblock(s->out_fd), set_nonblock(s->err_fd);
  }
  snprintf(s->cmd, sizeof(s->cmd), "%s", r->argv[0]);
  for (size_t i = 0; s->cmd[i]; i++)
    if (s->cmd[i] == '\t' || s->cmd[i] == '\n') s->cmd[i] = ' ';
  return 0;

fail_errno:
  e = errno;
  snprintf(msg, msgsz, "%s", strerror(e));
fail:
  if (pty >= 0) close(pty);
  if (slave >= 0) close(slave);
  for (int i = 0; i < 2; i++) {
    if (inp[i] >= 0) close(inp[i]);
    if (outp[i] >= 0) close(outp[i]);
    if (errp[i] >= 0) close(errp[i]);
    if (report[i] >= 0) close(report[i]);
  }
  return e;
}

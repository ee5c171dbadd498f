/* File operations for the host. They run here, inside the sandbox's root, so that a symlink
 * planted in the sandbox can never lead the host's engine to a path of the host: whatever a
 * path names, it names something of the sandbox. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "agent.h"

#define META_PREFIX "user.e2b."
#define MAX_META 64
#define META_KEY_MAX 128
#define META_VALUE_MAX 1024

static int metadata_lines(const char *path, char *out, size_t room);

static const char *payload_path(struct fp_header *h, char *pl, uint32_t skip) {
  if (h->len <= skip) return NULL;
  char *z = memchr(pl + skip, 0, h->len - skip);
  return z ? pl + skip : NULL;
}

/* Opens PATH to write a file's bytes: O_NONBLOCK, so that a FIFO the sandbox put there (with no
 * reader) is refused at once instead of holding the agent until one comes, and then a regular
 * file or nothing (a FIFO with a reader, a device: writes to them could block the agent too). */
static int open_for_write(const char *path, int oflags, uint32_t mode) {
  int fd = open(path, oflags | O_NONBLOCK | O_NOCTTY, mode & 07777);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

void do_write_file(struct conn *c, struct fp_header *h, char *pl) {
  uint32_t mode;
  const char *path = payload_path(h, pl, 4);
  if (!path) return send_error(c, h->id, EINVAL, "bad write");
  memcpy(&mode, pl, 4);
  const char *data = path + strlen(path) + 1;
  uint32_t n = (uint32_t)(pl + h->len - data);
  int fd = open_for_write(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 && errno == ENOENT) {
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
      *slash = 0;
      mkdir(dir, 0700);
      fd = open_for_write(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    }
  }
  if (fd < 0) return send_error(c, h->id, errno, errno == EINVAL ? "not a regular file" : strerror(errno));
  uint32_t off = 0;
  while (off < n) {
    ssize_t w = write(fd, data + off, n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      close(fd);
      return send_error(c, h->id, e, strerror(e));
    }
    off += (uint32_t)w;
  }
  close(fd);
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

/* READ_FILE: u32 max, path; READ_AT: u32 max, u64 offset, path. */
#define READ_CHUNK (64 * 1024)

void do_read_file(struct conn *c, struct fp_header *h, char *pl) {
  uint32_t max;
  uint64_t offset = 0;
  int at = h->type == FP_T_READ_AT;
  const char *path = payload_path(h, pl, at ? 12 : 4);
  if (!path) return send_error(c, h->id, EINVAL, "bad read");
  memcpy(&max, pl, 4);
  if (at) memcpy(&offset, pl + 4, 8);
  if (max > FP_MAX_FRAME - 64) max = FP_MAX_FRAME - 64;
  if (offset > (uint64_t)INT64_MAX) return send_error(c, h->id, EINVAL, "bad offset");
  /* O_NONBLOCK: a FIFO is opened (and refused by pread: ESPIPE), not waited on for a writer. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return send_error(c, h->id, errno, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return send_error(c, h->id, EISDIR, strerror(EISDIR));
  }
  char *buf = malloc((size_t)max + 1);
  if (!buf) {
    close(fd);
    return send_error(c, h->id, ENOMEM, "no memory");
  }
  uint32_t got = 0;
  for (;;) {
    /* At most 64 KiB a call: the kernel answers a read of a sysctl file (/proc/sys) of 4 MiB or
     * more with ENOMEM, whatever the file holds. */
    size_t want = (size_t)max + 1 - got;
    ssize_t r = pread(fd, buf + got, want < READ_CHUNK ? want : READ_CHUNK, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      free(buf);
      close(fd);
      return send_error(c, h->id, e, strerror(e));
    }
    if (r == 0) break;
    got += (uint32_t)r;
    if (got == max + 1) break;
  }
  close(fd);
  send_frame(c, FP_T_FILE, got > max ? 1 : 0, h->id, buf, got > max ? max : got);
  free(buf);
}

void do_remove_file(struct conn *c, struct fp_header *h, char *pl) {
  const char *path = payload_path(h, pl, 0);
  if (!path) return send_error(c, h->id, EINVAL, "bad remove");
  if (unlink(path) < 0 && errno != ENOENT && !(errno == EISDIR && rmdir(path) == 0))
    return send_error(c, h->id, errno, strerror(errno));
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

void do_list_dir(struct conn *c, struct fp_header *h, char *pl) {
  const char *path = payload_path(h, pl, 0);
  if (!path) return send_error(c, h->id, EINVAL, "bad list");
  DIR *d = opendir(path);
  if (!d) return send_error(c, h->id, errno, strerror(errno));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  struct dirent *e;
  while (f && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || strchr(e->d_name, '\n') || strchr(e->d_name, '\t')) continue;
    struct stat st;
    char type = 'o';
    long long size = 0;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      type = S_ISDIR(st.st_mode) ? 'd' : S_ISREG(st.st_mode) ? 'f' : S_ISLNK(st.st_mode) ? 'l' : 'o';
      size = (long long)st.st_size;
    }
    fprintf(f, "%s\t%c\t%lld\n", e->d_name, type, size);
  }
  closedir(d);
  if (!f) return send_error(c, h->id, ENOMEM, "no memory");
  fclose(f);
  send_frame(c, FP_T_FILE, 0, h->id, buf, (uint32_t)len);
  free(buf);
}

void do_mkdir(struct conn *c, struct fp_header *h, char *pl) {
  const char *path = payload_path(h, pl, 0);
  if (!path || path[0] != '/') return send_error(c, h->id, EINVAL, "bad mkdir");
  char dir[4096];
  snprintf(dir, sizeof(dir), "%s", path);
  for (char *p = dir + 1;; p++) {
    if (*p == '/' || *p == 0) {
      char saved = *p;
      *p = 0;
      if (mkdir(dir, 0755) < 0 && errno != EEXIST) return send_error(c, h->id, errno, strerror(errno));
      if (!saved) break;
      *p = saved;
    }
  }
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}


/* WRITE_AT: u32 mode, u32 flags, u64 offset, path\0, bytes. A piece of a file streamed in:
 * FP_WRITE_TRUNCATE creates or empties the file first (the first piece). */
void do_write_at(struct conn *c, struct fp_header *h, char *pl) {
  uint32_t mode, flags;
  uint64_t offset;
  const char *path = payload_path(h, pl, 16);
  if (!path) return send_error(c, h->id, EINVAL, "bad write");
  memcpy(&mode, pl, 4);
  memcpy(&flags, pl + 4, 4);
  memcpy(&offset, pl + 8, 8);
  if (offset > (uint64_t)INT64_MAX) return send_error(c, h->id, EINVAL, "bad offset");
  const char *data = path + strlen(path) + 1;
  uint32_t n = (uint32_t)(pl + h->len - data);
  int oflags = O_WRONLY | O_CLOEXEC | ((flags & FP_WRITE_TRUNCATE) ? O_CREAT | O_TRUNC : 0);
  int fd = open_for_write(path, oflags, mode);
  if (fd < 0) return send_error(c, h->id, errno, errno == EINVAL ? "not a regular file" : strerror(errno));
  uint32_t off = 0;
  while (off < n) {
    ssize_t w = pwrite(fd, data + off, n - off, (off_t)(offset + off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      close(fd);
      return send_error(c, h->id, e, strerror(e));
    }
    off += (uint32_t)w;
  }
  close(fd);
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

/* RENAME: from\0 to\0 */
void do_rename(struct conn *c, struct fp_header *h, char *pl) {
  const char *from = payload_path(h, pl, 0);
  if (!from) return send_error(c, h->id, EINVAL, "bad rename");
  uint32_t skip = (uint32_t)(strlen(from) + 1);
  const char *to = payload_path(h, pl, skip);
  if (!to) return send_error(c, h->id, EINVAL, "bad rename");
  if (rename(from, to) < 0) return send_error(c, h->id, errno, strerror(errno));
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

/* STAT: path\0 -> FILE "type\tsize\tmode\tmtime_ms\ttarget\n", "u\tUID\tGID\n" (the sandbox's own
 * ids), then the metadata lines (lstat; target for a link) */
void do_stat(struct conn *c, struct fp_header *h, char *pl) {
  const char *path = payload_path(h, pl, 0);
  if (!path) return send_error(c, h->id, EINVAL, "bad stat");
  struct stat st;
  if (lstat(path, &st) < 0) return send_error(c, h->id, errno, strerror(errno));
  char target[1024] = "";
  if (S_ISLNK(st.st_mode)) {
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = 0;
    for (char *t = target; *t; t++)
      if (*t == '\t' || *t == '\n') *t = ' ';
  }
  char type = S_ISDIR(st.st_mode) ? 'd' : S_ISREG(st.st_mode) ? 'f' : S_ISLNK(st.st_mode) ? 'l' : 'o';
  char line[1300 + MAX_META * (META_KEY_MAX + META_VALUE_MAX + 4)];
  int len = snprintf(line, 1200, "%c\t%lld\t%o\t%lld\t%s\n", type, (long long)st.st_size, st.st_mode & 07777,
                     (long long)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000, target);
  len += snprintf(line + len, 1300 - (size_t)len, "u\t%u\t%u\n", (unsigned)st.st_uid, (unsigned)st.st_gid);
  if (!S_ISLNK(st.st_mode)) len += metadata_lines(path, line + len, sizeof(line) - (size_t)len);
  send_frame(c, FP_T_FILE, 0, h->id, line, (uint32_t)len);
}

/* Printable ASCII without tab: what a line of the STAT answer can carry. */
static int printable(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] < 0x20 || s[i] > 0x7e) return 0;
  return 1;
}

/* "x\tKEY\tVALUE\n" for each user.e2b.KEY xattr of PATH (envd's file metadata), at most
 * MAX_META of them, each within its bounds and printable; others are left out. */
static int metadata_lines(const char *path, char *out, size_t room) {
  char names[8192];
  ssize_t n = llistxattr(path, names, sizeof(names));
  int len = 0, kept = 0;
  for (ssize_t at = 0; n > 0 && at < n && kept < MAX_META; at += (ssize_t)strlen(names + at) + 1) {
    const char *name = names + at;
    if (strncmp(name, META_PREFIX, strlen(META_PREFIX))) continue;
    const char *key = name + strlen(META_PREFIX);
    size_t klen = strlen(key);
    char value[META_VALUE_MAX];
    ssize_t v = lgetxattr(path, name, value, sizeof(value));
    if (!klen || klen > META_KEY_MAX || v < 0 || !printable(key, klen) || !printable(value, (size_t)v) || memchr(key, '\t', klen) || memchr(value, '\t', (size_t)v)) continue;
    if ((size_t)len + klen + (size_t)v + 4 > room) break;
    len += snprintf(out + len, room - (size_t)len, "x\t%s\t%.*s\n", key, (int)v, value);
    kept++;
  }
  return len;
}

/* SET_METADATA: path\0 then "KEY\tVALUE\n" lines: each becomes the xattr user.e2b.KEY (a
 * link is not followed). */
void do_set_metadata(struct conn *c, struct fp_header *h, char *pl) {
  const char *path = payload_path(h, pl, 0);
  if (!path) return send_error(c, h->id, EINVAL, "bad metadata");
  const char *p = path + strlen(path) + 1, *end = pl + h->len;
  int kept = 0;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p)), *tab = nl ? memchr(p, '\t', (size_t)(nl - p)) : NULL;
    if (!tab || tab == p || tab - p > META_KEY_MAX || nl - tab - 1 > META_VALUE_MAX || ++kept > MAX_META) return send_error(c, h->id, EINVAL, "bad metadata line");
    char name[sizeof(META_PREFIX) + META_KEY_MAX];
    snprintf(name, sizeof(name), "%s%.*s", META_PREFIX, (int)(tab - p), p);
    if (lsetxattr(path, name, tab + 1, (size_t)(nl - tab - 1), 0) < 0) return send_error(c, h->id, errno, strerror(errno));
    p = nl + 1;
  }
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

/* SET_OWNER_MODE: u32 what (FP_SET_UID | FP_SET_GID | FP_SET_MODE), u32 uid, u32 gid, u32 mode,
 * path\0. The owner of a link is the link's own; a link has no mode of its own (EINVAL). Between
 * the lstat and the chmod the sandbox could put a link in the file's place: the chmod then
 * changes what the link names, which is of the sandbox too (this runs inside its root). */
void do_set_owner_mode(struct conn *c, struct fp_header *h, char *pl) {
  uint32_t v[4];
  const char *path = payload_path(h, pl, sizeof(v));
  if (!path) return send_error(c, h->id, EINVAL, "bad owner or mode");
  memcpy(v, pl, sizeof(v));
  uint32_t what = v[0];
  if (!what || what & ~(uint32_t)(FP_SET_UID | FP_SET_GID | FP_SET_MODE)) return send_error(c, h->id, EINVAL, "nothing to change");
  struct stat st;
  if (lstat(path, &st) < 0) return send_error(c, h->id, errno, strerror(errno));
  if (what & FP_SET_MODE && S_ISLNK(st.st_mode)) return send_error(c, h->id, EINVAL, "a link has no mode of its own");
  if (what & (FP_SET_UID | FP_SET_GID) && lchown(path, what & FP_SET_UID ? (uid_t)v[1] : (uid_t)-1, what & FP_SET_GID ? (gid_t)v[2] : (gid_t)-1) < 0)
    return send_error(c, h->id, errno, strerror(errno));
  if (what & FP_SET_MODE && chmod(path, v[3] & 07777) < 0) return send_error(c, h->id, errno, strerror(errno));
  send_frame(c, FP_T_OK, 0, h->id, NULL, 0);
}

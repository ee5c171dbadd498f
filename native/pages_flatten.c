/* fp-agent pages-flatten DIR PARENT: makes an incremental CRIU memory image whole.
 *
 * A dump with dirty-page tracking (wp_hold.c, deploy/criu/0009-*) writes only the pages written
 * since its parent's dump; the others are entries flagged "in parent" (PE_PARENT) in its
 * pagemap-*.img. forkpoint keeps every checkpoint's image self-contained (deleted, uploaded,
 * forked on another node on its own), so after the thaw each such pagemap is rewritten with
 * those pages copied from PARENT's (whole) image, in the kernel (copy_file_range), and the
 * `parent` link CRIU left is removed. The new files replace the old by rename.
 *
 * Image format (CRIU's images/pagemap.proto): u32 IMG_COMMON_MAGIC, u32 PAGEMAP_MAGIC, then
 * messages as u32 length + protobuf: a pagemap_head {pages_id = 1}, then pagemap_entry
 * {vaddr = 1, compat_nr_pages = 2, in_parent = 3, flags = 4, nr_pages = 5} in address order;
 * pages-<pages_id>.img holds the pages of PE_PRESENT entries, in order. Every length and
 * offset is checked before use: the images are CRIU's, but what they describe is a sandbox's. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp.h"

#define IMG_COMMON_MAGIC 0x54564319u
#define PAGEMAP_MAGIC 0x56084025u
#define PE_PARENT (1u << 0)
#define PE_LAZY (1u << 1)
#define PE_PRESENT (1u << 2)
#define PAGE 4096ull
#define MAX_PAGEMAP_BYTES (256u << 20)
#define MAX_MESSAGE 64
#define MAX_PAGES (1ull << 36)

struct entry {
  uint64_t vaddr, nr, flags, off; /* off: in the pages file, for PE_PRESENT */
};

struct pagemap {
  uint32_t pages_id;
  size_t n;
  struct entry *e;
};

static char err[512];

static int fail(const char *fmt, const char *a) {
  snprintf(err, sizeof(err), fmt, a);
  return -1;
}

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return 0;
  }
  return -1;
}

/* The fields of one message, varints only (what both messages hold); others are refused. */
static int fields(const uint8_t *p, const uint8_t *end, uint64_t val[6], int seen[6]) {
  memset(seen, 0, 6 * sizeof(int));
  while (p < end) {
    uint64_t key, v;
    if (varint(&p, end, &key) || (key & 7) != 0 || (key >> 3) == 0 || (key >> 3) > 5) return -1;
    if (varint(&p, end, &v)) return -1;
    val[key >> 3] = v;
    seen[key >> 3] = 1;
  }
  return 0;
}

static int read_pagemap(int dirfd, const char *name, struct pagemap *pm) {
  int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < 8 || st.st_size > MAX_PAGEMAP_BYTES) {
    if (fd >= 0) close(fd);
    return fail("%s: not a readable pagemap", name);
  }
  uint8_t *buf = malloc((size_t)st.st_size);
  if (!buf || read_full(fd, buf, (size_t)st.st_size)) {
    free(buf);
    close(fd);
    return fail("%s: unreadable", name);
  }
  close(fd);
  const uint8_t *p = buf, *end = buf + st.st_size;
  uint32_t m[2];
  memcpy(m, p, 8);
  p += 8;
  if (m[0] != IMG_COMMON_MAGIC || m[1] != PAGEMAP_MAGIC) goto bad;
  pm->n = 0;
  pm->e = malloc(sizeof(struct entry) * ((size_t)st.st_size / 4 + 1));
  if (!pm->e) goto bad;
  uint64_t off = 0;
  int head = 1;
  while (p < end) {
    uint32_t len;
    if (end - p < 4) goto bad;
    memcpy(&len, p, 4);
    p += 4;
    if (len > MAX_MESSAGE || (size_t)(end - p) < len) goto bad;
    uint64_t v[6] = {0};
    int seen[6];
    if (fields(p, p + len, v, seen)) goto bad;
    p += len;
    if (head) {
      if (!seen[1] || v[1] > UINT32_MAX) goto bad;
      pm->pages_id = (uint32_t)v[1];
      head = 0;
      continue;
    }
    struct entry *e = &pm->e[pm->n++];
    e->vaddr = v[1];
    e->nr = seen[5] ? v[5] : v[2];
    e->flags = seen[4] ? v[4] : (seen[3] && v[3] ? PE_PARENT : PE_PRESENT);
    if (e->nr == 0 || e->nr > MAX_PAGES || e->vaddr % PAGE || e->vaddr > UINT64_MAX - e->nr * PAGE) goto bad;
    if (pm->n > 1 && e->vaddr < pm->e[pm->n - 2].vaddr + pm->e[pm->n - 2].nr * PAGE) goto bad;
    e->off = off;
    if (e->flags & PE_PRESENT) off += e->nr * PAGE;
  }
  free(buf);
  return head ? fail("%s: no pagemap head", name) : 0;
bad:
  free(buf);
  free(pm->e);
  pm->e = NULL;
  return fail("%s: not a pagemap image forkpoint can read", name);
}

static int copy_range(int from, uint64_t off, int to, uint64_t len) {
  loff_t in = (loff_t)off;
  while (len) {
    ssize_t n = copy_file_range(from, &in, to, NULL, len > (1u << 30) ? (1u << 30) : len, 0);
    if (n <= 0) return -1; /* 0: the source is shorter than its pagemap says */
    len -= (uint64_t)n;
  }
  return 0;
}

static int put_varint(uint8_t *b, uint64_t v) {
  int n = 0;
  do {
    b[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  return n;
}

static int write_entry(int fd, uint64_t vaddr, uint64_t nr, uint64_t flags) {
  uint8_t b[4 + MAX_MESSAGE];
  int n = 4;
  b[n++] = 1 << 3;
  n += put_varint(b + n, vaddr);
  b[n++] = 2 << 3;
  b[n++] = 0; /* compat_nr_pages: required, superseded by nr_pages */
  b[n++] = 4 << 3;
  n += put_varint(b + n, flags);
  b[n++] = 5 << 3;
  n += put_varint(b + n, nr);
  uint32_t len = (uint32_t)(n - 4);
  memcpy(b, &len, 4);
  return write_full(fd, b, (size_t)n);
}

static int open_pages(int dirfd, uint32_t id) {
  char name[64];
  snprintf(name, sizeof(name), "pages-%u.img", id);
  return openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
}

/* Rewrites DIR's NAME whole if it has entries in the parent; 1 if it did, 0 if none. */
static int flatten_one(int dirfd, int parentfd, const char *name, uint64_t *from_parent) {
  struct pagemap child = {0}, parent = {0};
  int ret = -1, cpages = -1, ppages = -1, out_map = -1, out_pages = -1;
  char tmp_map[300], tmp_pages[80], pages_name[64];
  if (read_pagemap(dirfd, name, &child)) return -1;
  size_t k = 0;
  while (k < child.n && !(child.e[k].flags & PE_PARENT)) k++;
  if (k == child.n) {
    free(child.e);
    return 0;
  }
  if (read_pagemap(parentfd, name, &parent)) goto out;
  for (size_t i = 0; i < parent.n; i++)
    if (parent.e[i].flags & PE_PARENT) {
      fail("%s: the parent's image is not whole", name);
      goto out;
    }
  snprintf(pages_name, sizeof(pages_name), "pages-%u.img", child.pages_id);
  snprintf(tmp_map, sizeof(tmp_map), ".flat-%s", name);
  snprintf(tmp_pages, sizeof(tmp_pages), ".flat-%s", pages_name);
  cpages = open_pages(dirfd, child.pages_id);
  ppages = open_pages(parentfd, parent.pages_id);
  out_map = openat(dirfd, tmp_map, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  out_pages = openat(dirfd, tmp_pages, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (cpages < 0 || ppages < 0 || out_map < 0 || out_pages < 0) {
    fail("%s: cannot open its pages or write the new image", name);
    goto out;
  }
  /* The new files are read as CRIU's were (a restore into a user namespace reads them as
   * that namespace's root): their owner and mode are the originals'. */
  struct stat st;
  if (fstat(cpages, &st) || fchown(out_map, st.st_uid, st.st_gid) || fchown(out_pages, st.st_uid, st.st_gid) ||
      fchmod(out_map, st.st_mode & 0777) || fchmod(out_pages, st.st_mode & 0777))
    goto io;
  uint32_t magic[2] = {IMG_COMMON_MAGIC, PAGEMAP_MAGIC};
  uint8_t head[16];
  int hn = 4;
  head[hn++] = 1 << 3;
  hn += put_varint(head + hn, child.pages_id);
  uint32_t hlen = (uint32_t)(hn - 4);
  memcpy(head, &hlen, 4);
  if (write_full(out_map, magic, 8) || write_full(out_map, head, (size_t)hn)) goto io;
  size_t j = 0; /* parent entries before j end at or before the current address */
  for (size_t i = 0; i < child.n; i++) {
    struct entry *e = &child.e[i];
    if (!(e->flags & PE_PARENT)) {
      if (write_entry(out_map, e->vaddr, e->nr, e->flags)) goto io;
      if ((e->flags & PE_PRESENT) && copy_range(cpages, e->off, out_pages, e->nr * PAGE)) goto io;
      continue;
    }
    uint64_t at = e->vaddr, end = e->vaddr + e->nr * PAGE;
    while (at < end) {
      while (j < parent.n && parent.e[j].vaddr + parent.e[j].nr * PAGE <= at) j++;
      if (j == parent.n || parent.e[j].vaddr > at || !(parent.e[j].flags & PE_PRESENT)) {
        fail("%s: a page the image leaves to its parent is not in the parent's", name);
        goto out;
      }
      struct entry *pe = &parent.e[j];
      uint64_t piece_end = pe->vaddr + pe->nr * PAGE < end ? pe->vaddr + pe->nr * PAGE : end;
      uint64_t nr = (piece_end - at) / PAGE;
      if (write_entry(out_map, at, nr, (pe->flags & ~PE_PARENT) | PE_PRESENT)) goto io;
      if (copy_range(ppages, pe->off + (at - pe->vaddr), out_pages, nr * PAGE)) goto io;
      *from_parent += nr;
      at = piece_end;
    }
  }
  if (renameat(dirfd, tmp_pages, dirfd, pages_name) || renameat(dirfd, tmp_map, dirfd, name)) goto io;
  ret = 1;
  goto out;
io:
  snprintf(err, sizeof(err), "%s: %s", name, strerror(errno));
out:
  if (ret < 0) {
    unlinkat(dirfd, tmp_map, 0);
    unlinkat(dirfd, tmp_pages, 0);
  }
  if (cpages >= 0) close(cpages);
  if (ppages >= 0) close(ppages);
  if (out_map >= 0) close(out_map);
  if (out_pages >= 0) close(out_pages);
  free(child.e);
  free(parent.e);
  return ret;
}

int pages_flatten_main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: fp-agent pages-flatten DIR PARENT\n");
    return 2;
  }
  int dirfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int parentfd = open(argv[2], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dirfd < 0 || parentfd < 0) {
    fprintf(stderr, "pages-flatten: %s\n", strerror(errno));
    return 1;
  }
  DIR *d = fdopendir(dup(dirfd));
  if (!d) return 1;
  struct dirent *de;
  uint64_t from_parent = 0;
  int files = 0;
  while ((de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (strncmp(de->d_name, "pagemap-", 8) || len < 12 || strcmp(de->d_name + len - 4, ".img")) continue;
    int r = flatten_one(dirfd, parentfd, de->d_name, &from_parent);
    if (r < 0) {
      fprintf(stderr, "pages-flatten: %s\n", err);
      return 1;
    }
    files += r;
  }
  closedir(d);
  if (unlinkat(dirfd, "parent", 0) && errno != ENOENT) {
    fprintf(stderr, "pages-flatten: parent link: %s\n", strerror(errno));
    return 1;
  }
  fprintf(stderr, "flattened %d %llu\n", files, (unsigned long long)from_parent);
  return 0;
}

/* Network set-up shared by the host-side roles. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <string.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fp.h"

/* Brings lo up in the calling thread's network namespace (a new netns has it down). */
int loopback_up(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct ifreq ifr = {0};
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
  int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
  if (rc == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    rc = ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  close(s);
  return rc;
}

/* Writes VALUE to the sysctl file PATH; -1 with errno when it could not. */
int write_sysctl(const char *path, const char *value) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, value, strlen(value));
  close(fd);
  return n == (ssize_t)strlen(value) ? 0 : -1;
}

/* What Docker sets in every container's network namespace: any port may be bound and ICMP
 * echo sockets opened without a capability (a sandbox's users are not root). Per namespace:
 * the calling thread's must be the sandbox's. */
int netns_defaults(void) {
  if (write_sysctl("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0") < 0) return -1;
  /* Every group: the host's ids written from the host, the namespace's from inside a user
   * namespace (where gids past its map are EINVAL). */
  if (write_sysctl("/proc/sys/net/ipv4/ping_group_range", "0 2147483647") == 0) return 0;
  return errno == EINVAL ? write_sysctl("/proc/sys/net/ipv4/ping_group_range", "0 65535") : -1;
}

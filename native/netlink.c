/* A sandbox's network link, by rtnetlink: one veth pair, its host end routed and its sandbox end
 * (eth0) addressed, in a handful of syscalls instead of a dozen `ip` processes.
 *
 * The sandbox gets ADDR/32 on eth0, a route to the gateway GW on eth0 and a default route via
 * it; the host gets HOSTIF up and a /32 route to ADDR through it (for a restore, only when the
 * restore starts: net_route). GW itself is a host address
 * (the engine keeps it on a dummy link), so the host answers the sandbox's ARP for it. No bridge:
 * every packet between two sandboxes is routed through the host, where the firewall sees it.
 * IPv6 is switched off on both ends: a sandbox gets no address, link-local included, to reach the
 * host by. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fp.h"

struct nlreq {
  struct nlmsghdr h;
  char buf[1024];
};

static struct rtattr *attr_at(struct nlreq *r) {
  return (struct rtattr *)((char *)r + NLMSG_ALIGN(r->h.nlmsg_len));
}

static int add_attr(struct nlreq *r, unsigned short type, const void *data, size_t len) {
  size_t need = NLMSG_ALIGN(r->h.nlmsg_len) + RTA_SPACE(len);
  if (need > sizeof(*r)) return -1;
  struct rtattr *a = attr_at(r);
  a->rta_type = type;
  a->rta_len = RTA_LENGTH(len);
  if (len) memcpy(RTA_DATA(a), data, len);
  r->h.nlmsg_len = need;
  return 0;
}

static struct rtattr *nest_begin(struct nlreq *r, unsigned short type) {
  struct rtattr *a = attr_at(r);
  if (add_attr(r, type, NULL, 0) < 0) return NULL;
  return a;
}

static void nest_end(struct nlreq *r, struct rtattr *a) {
  a->rta_len = (unsigned short)((char *)r + r->h.nlmsg_len - (char *)a);
}

/* Sends one request and waits for its acknowledgement; 0 or -errno. */
static int talk(int sk, struct nlreq *r) {
  static unsigned seq;
  r->h.nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
  r->h.nlmsg_seq = ++seq;
  struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
  if (sendto(sk, r, r->h.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0) return -errno;
  char buf[4096];
  for (;;) {
    ssize_t n = recv(sk, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (unsigned)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != r->h.nlmsg_seq || h->nlmsg_type != NLMSG_ERROR) continue;
      struct nlmsgerr *e = NLMSG_DATA(h);
      return e->error;
    }
  }
}

static int open_rtnl(void) {
  int sk = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (sk < 0) return -1;
  struct timeval tv = {.tv_sec = 5};
  setsockopt(sk, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return sk;
}

static void link_req(struct nlreq *r, int type, int flags, int index) {
  memset(r, 0, sizeof(*r));
  r->h.nlmsg_len = NLMSG_LENGTH(sizeof(struct ifinfomsg));
  r->h.nlmsg_type = (unsigned short)type;
  r->h.nlmsg_flags = (unsigned short)flags;
  struct ifinfomsg *ifi = NLMSG_DATA(&r->h);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = index;
}

static int set_up(int sk, int index) {
  struct nlreq r;
  link_req(&r, RTM_NEWLINK, 0, index);
  struct ifinfomsg *ifi = NLMSG_DATA(&r.h);
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  return talk(sk, &r);
}

static int add_addr(int sk, int index, struct in_addr a) {
  struct nlreq r;
  memset(&r, 0, sizeof(r));
  r.h.nlmsg_len = NLMSG_LENGTH(sizeof(struct ifaddrmsg));
  r.h.nlmsg_type = RTM_NEWADDR;
  r.h.nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
  struct ifaddrmsg *ifa = NLMSG_DATA(&r.h);
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = 32;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = (unsigned)index;
  if (add_attr(&r, IFA_LOCAL, &a, 4) < 0 || add_attr(&r, IFA_ADDRESS, &a, 4) < 0) return -E2BIG;
  return talk(sk, &r);
}

/* The common end of a netns excursion: the socket closed, back in the thread's own netns (a
 * failure to get back is an error even when the work succeeded). */
static int leave(int sk, int back, int rc, char *err, size_t errlen) {
  if (sk >= 0) close(sk);
  if (back >= 0) {
    if (setns(back, CLONE_NEWNET) < 0 && rc == 0) {
      snprintf(err, errlen, "net: back to the own netns: %s", strerror(errno));
      rc = -1;
    }
    close(back);
  }
  return rc;
}

/* A route to DST/LEN: through GW if given, else on the link OIF; from SRC if given (the host's
 * route to a sandbox is from its own server's gateway: with several servers on one host, the
 * kernel would otherwise pick any of their gateways on lo, and the sandbox's answers to another
 * server's address are refused by the firewall). */
static int add_route(int sk, struct in_addr dst, int len, const struct in_addr *gw, int oif, const struct in_addr *src) {
  struct nlreq r;
  memset(&r, 0, sizeof(r));
  r.h.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtmsg));
  r.h.nlmsg_type = RTM_NEWROUTE;
  r.h.nlmsg_flags = NLM_F_CREATE | NLM_F_REPLACE;
  struct rtmsg *rt = NLMSG_DATA(&r.h);
  rt->rtm_family = AF_INET;
  rt->rtm_dst_len = (unsigned char)len;
  rt->rtm_table = RT_TABLE_MAIN;
  rt->rtm_protocol = RTPROT_STATIC;
  rt->rtm_scope = gw ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
  rt->rtm_type = RTN_UNICAST;
  if (len && add_attr(&r, RTA_DST, &dst, 4) < 0) return -E2BIG;
  if (gw && add_attr(&r, RTA_GATEWAY, gw, 4) < 0) return -E2BIG;
  if (add_attr(&r, RTA_OIF, &oif, 4) < 0) return -E2BIG;
  if (src && add_attr(&r, RTA_PREFSRC, src, 4) < 0) return -E2BIG;
  return talk(sk, &r);
}

static int parse_mac(const char *s, unsigned char mac[6]) {
  unsigned v[6];
  if (sscanf(s, "%2x:%2x:%2x:%2x:%2x:%2x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) return -1;
  for (int i = 0; i < 6; i++) mac[i] = (unsigned char)v[i];
  return 0;
}

/* How long a link's set-up waits for another's to finish before it goes on beside it. */
#define HOST_LINKS_WAIT_MS 2000

/* Takes the host's link set-up lock: flock on the host netns's own inode (HOST_NS, this process's
 * own open of it), so every set-up on the host, booted or restored, takes the same one, with no
 * path to share. A host interface's IPv6 switch takes the kernel's rtnl lock by trylock and
 * restarts the write until it gets it: with many restores at once (100 forks) each spun on the
 * others' netlink calls, a fifth of a fork's CPU. Set-ups one at a time contend with nothing but
 * the kernel's own rtnl users. Bounded: past the wait it goes on unlocked, as before. Released
 * when the caller's open of the netns is closed or by host_links_unlock.
 *
 * The wait blocks in flock, woken by the unlock. It used to poll every 200 us: with a hundred
 * forks queued that polling was a quarter of the host's CPU (perf of bench/fork-many.ts). A
 * periodic SIGALRM (every 50 ms, so that one arriving just before the flock cannot leave it
 * blocked for good) interrupts the flock to look at the deadline. */
static void links_lock_alarm(int sig) { (void)sig; }

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int host_links_lock(int host_ns) {
  if (flock(host_ns, LOCK_EX | LOCK_NB) == 0) return 1;
  if (errno != EWOULDBLOCK) return 0;
  struct sigaction on = {.sa_handler = links_lock_alarm}, old;
  sigemptyset(&on.sa_mask); /* no SA_RESTART: the flock returns EINTR */
  if (sigaction(SIGALRM, &on, &old) < 0) return 0;
  struct itimerval tick = {.it_interval = {0, 50 * 1000}, .it_value = {0, 50 * 1000}}, off = {{0, 0}, {0, 0}};
  int locked = 0;
  if (setitimer(ITIMER_REAL, &tick, NULL) == 0) {
    long long deadline = now_ms() + HOST_LINKS_WAIT_MS;
    for (;;) {
      if (flock(host_ns, LOCK_EX) == 0) {
        locked = 1;
        break;
      }
      if (errno != EINTR || now_ms() >= deadline) break;
    }
    setitimer(ITIMER_REAL, &off, NULL);
  }
  sigaction(SIGALRM, &old, NULL);
  return locked;
}

static void host_links_unlock(int host_ns, int locked) {
  if (locked) flock(host_ns, LOCK_UN);
}

#define FAIL(...)                              \
  do {                                         \
    snprintf(err, errlen, __VA_ARGS__);        \
    goto out;                                  \
  } while (0)

int net_setup(int host_ns, int sandbox_ns, const char *host_if, const char *addr, const char *gw, const char *mac, int with_route, char *err,
              size_t errlen) {
  struct in_addr a, g;
  unsigned char hw[6];
  int rc = -1, sk = -1, e, locked = 0;
  int back = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (strlen(host_if) >= IFNAMSIZ || inet_pton(AF_INET, addr, &a) != 1 || inet_pton(AF_INET, gw, &g) != 1 || parse_mac(mac, hw) < 0) {
    snprintf(err, errlen, "net: bad arguments");
    if (back >= 0) close(back);
    return -1;
  }
  if (back < 0) FAIL("net: own netns: %s", strerror(errno));

  /* The sandbox's eth0 is born with IPv6 off: its netns's default says so before it exists.
   * (The default takes no lock; `all`, or a device's own switch, takes the kernel's rtnl lock
   * by trylock and restarts the write until it gets it: under many concurrent restores that
   * spin was a fifth of a fork's CPU.) Loopback keeps ::1, as in Docker's containers. */
  if (setns(sandbox_ns, CLONE_NEWNET) < 0) FAIL("net: enter the sandbox netns: %s", strerror(errno));
  if (write_sysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1") < 0 && errno != ENOENT) FAIL("net: IPv6 off: %s", strerror(errno));

  /* The pair, made in the host's netns with its sandbox end put straight into the sandbox's. */
  if (setns(host_ns, CLONE_NEWNET) < 0) FAIL("net: enter the host netns: %s", strerror(errno));
  locked = host_links_lock(host_ns);
  if ((sk = open_rtnl()) < 0) FAIL("net: netlink: %s", strerror(errno));
  /* One queue each way, asked for at creation: a veth not told so is born with a queue per CPU
   * and cut to one once registered, each cut waiting out an expedited RCU grace period while it
   * holds the kernel's rtnl lock (two a pair): half of making the pair when quiet (0.83 against
   * 0.37 ms p50 here), longer when other grace periods are queued. */
  const uint32_t one_queue = 1;
  struct nlreq r;
  link_req(&r, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0);
  add_attr(&r, IFLA_IFNAME, host_if, strlen(host_if) + 1);
  add_attr(&r, IFLA_NUM_TX_QUEUES, &one_queue, sizeof(one_queue));
  add_attr(&r, IFLA_NUM_RX_QUEUES, &one_queue, sizeof(one_queue));
  struct rtattr *info = nest_begin(&r, IFLA_LINKINFO);
  add_attr(&r, IFLA_INFO_KIND, "veth", 4);
  struct rtattr *data = nest_begin(&r, IFLA_INFO_DATA);
  struct rtattr *peer = nest_begin(&r, VETH_INFO_PEER);
  struct ifinfomsg peer_ifi = {.ifi_family = AF_UNSPEC};
  /* The peer's own ifinfomsg comes first in VETH_INFO_PEER, then its attributes. */
  r.h.nlmsg_len += NLMSG_ALIGN(sizeof(peer_ifi));
  memcpy(RTA_DATA(peer), &peer_ifi, sizeof(peer_ifi));
  add_attr(&r, IFLA_IFNAME, "eth0", 5);
  add_attr(&r, IFLA_NUM_TX_QUEUES, &one_queue, sizeof(one_queue));
  add_attr(&r, IFLA_NUM_RX_QUEUES, &one_queue, sizeof(one_queue));
  add_attr(&r, IFLA_NET_NS_FD, &sandbox_ns, 4);
  if (add_attr(&r, IFLA_ADDRESS, hw, 6) < 0) FAIL("net: request too long");
  nest_end(&r, peer);
  nest_end(&r, data);
  nest_end(&r, info);
  if ((e = talk(sk, &r)) < 0) FAIL("net: create %s: %s", host_if, strerror(-e));
  int host_index = (int)if_nametoindex(host_if);
  if (!host_index) FAIL("net: %s: %s", host_if, strerror(errno));
  char path[96];
  snprintf(path, sizeof(path), "/proc/sys/net/ipv6/conf/%s/disable_ipv6", host_if);
  write_sysctl(path, "1");
  if ((e = set_up(sk, host_index)) < 0) FAIL("net: up %s: %s", host_if, strerror(-e));
  if (with_route && (e = add_route(sk, a, 32, NULL, host_index, &g)) < 0) FAIL("net: route to %s: %s", addr, strerror(-e));
  close(sk);
  sk = -1;
  host_links_unlock(host_ns, locked);
  locked = 0;

  /* The sandbox's end. */
  if (setns(sandbox_ns, CLONE_NEWNET) < 0) FAIL("net: enter the sandbox netns: %s", strerror(errno));
  if ((sk = open_rtnl()) < 0) FAIL("net: netlink: %s", strerror(errno));
  int eth0 = (int)if_nametoindex("eth0");
  int lo = (int)if_nametoindex("lo");
  if (!eth0) FAIL("net: eth0: %s", strerror(errno));
  if (lo) set_up(sk, lo);
  if ((e = add_addr(sk, eth0, a)) < 0) FAIL("net: address %s: %s", addr, strerror(-e));
  if ((e = set_up(sk, eth0)) < 0) FAIL("net: up eth0: %s", strerror(-e));
  if ((e = add_route(sk, g, 32, NULL, eth0, NULL)) < 0) FAIL("net: route to the gateway: %s", strerror(-e));
  struct in_addr any = {0};
  if ((e = add_route(sk, any, 0, &g, eth0, NULL)) < 0) FAIL("net: default route: %s", strerror(-e));
  rc = 0;
out:
  host_links_unlock(host_ns, locked);
  return leave(sk, back, rc, err, errlen);
}

/* Points the host's route to ADDR at HOST_IF: the moment a restored sandbox takes the address
 * over from the one it replaces (whose link may still exist), once its sockets are restored. */
int net_route(int host_ns, const char *host_if, const char *addr, const char *gw, char *err, size_t errlen) {
  struct in_addr a, g;
  int rc = -1, sk = -1, e;
  int back = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (inet_pton(AF_INET, addr, &a) != 1 || inet_pton(AF_INET, gw, &g) != 1) {
    snprintf(err, errlen, "net: bad address");
    if (back >= 0) close(back);
    return -1;
  }
  if (back < 0) FAIL("net: own netns: %s", strerror(errno));
  if (setns(host_ns, CLONE_NEWNET) < 0) FAIL("net: enter the host netns: %s", strerror(errno));
  int index = (int)if_nametoindex(host_if);
  if (!index) FAIL("net: %s: %s", host_if, strerror(errno));
  if ((sk = open_rtnl()) < 0) FAIL("net: netlink: %s", strerror(errno));
  if ((e = add_route(sk, a, 32, NULL, index, &g)) < 0) FAIL("net: route to %s: %s", addr, strerror(-e));
  rc = 0;
out:
  return leave(sk, back, rc, err, errlen);
}

/* fp-agent net-setup PID HOSTIF ADDR GW MAC: the link of a sandbox just booted (PID is its PID
 * 1 on the host), from the host's netns. */
int net_setup_main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: fp-agent net-setup PID HOSTIF ADDR GW MAC\n");
    return 2;
  }
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/ns/net", atoi(argv[1]));
  int host = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  int sandbox = open(path, O_RDONLY | O_CLOEXEC);
  if (host < 0 || sandbox < 0) {
    perror("net-setup: namespaces");
    return 1;
  }
  char err[256];
  if (net_setup(host, sandbox, argv[2], argv[3], argv[4], argv[5], 1, err, sizeof(err)) < 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  return 0;
}

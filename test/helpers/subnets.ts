import { randomInt } from 'node:crypto';
import { subnetFor } from '../../src/lib/ipv4.js';

// Servers of the three workers run side by side, and two live servers on one host must not share
// a subnet (the second refuses to start: its lock is held). A subnet hashed from each data
// directory's name collided now and then (a fresh clone's run of 2026-11-29 failed on it: about
// 200 servers, a few alive at once, 32,768 subnets). So each worker hands out its own: the second
// octet is the worker's (VITEST_POOL_ID is unique among the live workers), the third a counter,
// from a random start so that a worker given a finished one's id does not retrace its subnets.
const bySeed = new Map<string, string>();
let next = randomInt(256);

/** The /24 a test server of `seed` (its data directory) runs on: the same for the same seed, as a
 * restart on that data directory needs; never one another live worker's server has. */
export function testSubnet(seed: string): string {
  let subnet = bySeed.get(seed);
  if (subnet) return subnet;
  const worker = Number(process.env.VITEST_POOL_ID);
  // Outside vitest (a script importing the helpers) there is one process: hash as before.
  subnet = Number.isInteger(worker) && worker > 0 ? `10.${128 + (worker & 127)}.${next++ & 255}.0/24` : subnetFor(seed);
  bySeed.set(seed, subnet);
  return subnet;
}

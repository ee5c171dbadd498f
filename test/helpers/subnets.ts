import { randomInt } from 'node:crypto';
import { linkPrefixOf, subnetFor } from '../../src/lib/ipv4.js';

// Servers of the three workers run side by side, and two live servers on one host must share
// neither a subnet nor the link prefix hashed from it (the second refuses to start: its lock is
// held). A subnet hashed from each data directory's name collided now and then (a fresh clone's
// run of 2026-11-29 failed on it: about 200 servers, a few alive at once, 32,768 subnets and
// 4,096 prefixes). So each worker hands out its own: subnets in 10.(128 + 16 × worker + 0..15).x,
// each one's prefix in the worker's eighth of them (its hash modulo 8 is the worker's number,
// VITEST_POOL_ID, unique among live workers), and no prefix twice in one worker while it has
// others left. From a random start, so that a worker given a finished one's number does not
// retrace its subnets.
const bySeed = new Map<string, string>();
const prefixesGiven = new Set<string>();
let next = randomInt(4096);

function nextSubnet(worker: number): string {
  for (let tries = 0; tries < 2 * 4096; tries++) {
    const k = next++ & 4095;
    if (tries === 4096) prefixesGiven.clear();
    const subnet = `10.${128 + 16 * (worker & 7) + (k >> 8)}.${k & 255}.0/24`;
    const prefix = linkPrefixOf(subnet);
    if (parseInt(prefix.slice(2), 16) % 8 !== (worker & 7) || prefixesGiven.has(prefix)) continue;
    prefixesGiven.add(prefix);
    return subnet;
  }
  throw new Error('no subnet left for this worker');
}

/** The /24 a test server of `seed` (its data directory) runs on: the same for the same seed, as a
 * restart on that data directory needs; never one, nor one of the same link prefix, that another
 * live worker's server has. */
export function testSubnet(seed: string): string {
  let subnet = bySeed.get(seed);
  if (subnet) return subnet;
  const worker = Number(process.env.VITEST_POOL_ID);
  // Outside vitest (a script importing the helpers) there is one process: hash as before.
  subnet = Number.isInteger(worker) && worker > 0 ? nextSubnet(worker) : subnetFor(seed);
  bySeed.set(seed, subnet);
  return subnet;
}

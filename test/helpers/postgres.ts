import { execFile } from 'node:child_process';
import { chown, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import pg from 'pg';

const run = promisify(execFile);
const RUN_TIMEOUT_MS = 60_000;

/** The newest PostgreSQL server Debian installed (set-up installs it for the tests). */
async function binDir(): Promise<string> {
  const versions = (await readdir('/usr/lib/postgresql').catch(() => [] as string[])).filter((v) => /^\d+$/.test(v)).sort((a, b) => Number(b) - Number(a));
  if (!versions[0]) throw new Error('no PostgreSQL server under /usr/lib/postgresql: run `bash deploy/setup.sh --test`');
  return `/usr/lib/postgresql/${versions[0]}/bin`;
}

/**
 * A throwaway PostgreSQL cluster in a temporary directory, reached over a Unix socket in that
 * directory only (no TCP port: nothing outside the machine, no port to collide on). The server
 * refuses to run as root, so it runs as Debian's `postgres` user.
 */
export class TestPostgres {
  private constructor(
    private readonly dir: string,
    private readonly bin: string,
  ) {}

  static async start(): Promise<TestPostgres> {
    const bin = await binDir();
    const dir = await mkdtemp(join(tmpdir(), 'fp-pg-'));
    const pgUser = await run('id', ['-u', 'postgres']).then((r) => Number(r.stdout.trim()));
    const pgGroup = await run('id', ['-g', 'postgres']).then((r) => Number(r.stdout.trim()));
    await chown(dir, pgUser, pgGroup);
    const db = new TestPostgres(dir, bin);
    try {
      await db.asPostgres('initdb', ['-D', join(dir, 'data'), '-U', 'forkpoint', '-A', 'trust', '--no-sync', '-E', 'UTF8']);
      await db.resume();
    } catch (err) {
      await db.stop();
      throw err;
    }
    return db;
  }

  private asPostgres(tool: string, args: string[]) {
    return run('runuser', ['-u', 'postgres', '--', join(this.bin, tool), ...args], { timeout: RUN_TIMEOUT_MS });
  }

  /** The URL of a database of that name (made if it is not there). */
  async database(name: string): Promise<string> {
    const client = new pg.Client({ host: this.dir, user: 'forkpoint', database: 'postgres', connectionTimeoutMillis: 10_000 });
    await client.connect();
    try {
      const exists = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
      if (exists.rowCount === 0) await client.query(`CREATE DATABASE "${name.replace(/"/g, '')}"`);
    } finally {
      await client.end();
    }
    return this.url(name);
  }

  url(database: string): string {
    return `postgresql://forkpoint@localhost/${database}?host=${encodeURIComponent(this.dir)}`;
  }

  /** Starts the server (again, after `pause`) on its data. */
  async resume(): Promise<void> {
    await this.asPostgres('pg_ctl', [
      '-D', join(this.dir, 'data'), '-l', join(this.dir, 'log'), '-w', '-t', '30', 'start',
      '-o', `-c listen_addresses='' -k ${this.dir} -c fsync=off -c full_page_writes=off -c max_connections=200`,
    ]);
  }

  /** Stops the server at once, as a crash would, keeping its data for `resume`. */
  async pause(): Promise<void> {
    await this.asPostgres('pg_ctl', ['-D', join(this.dir, 'data'), '-m', 'immediate', '-w', '-t', '30', 'stop']);
  }

  /** Stops the server at once and removes its directory. */
  async stop(): Promise<void> {
    await this.asPostgres('pg_ctl', ['-D', join(this.dir, 'data'), '-m', 'immediate', '-w', '-t', '30', 'stop']).catch(() => {});
    await rm(this.dir, { recursive: true, force: true });
  }
}

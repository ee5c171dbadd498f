/** Versioned schema. Append only: a released migration is never edited. */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export const migrations: readonly Migration[] = [
  {
    version: 1,
    name: 'tokens',
    sql: `
      CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        secret_hash BLOB NOT NULL,
        created_at TEXT NOT NULL,
        last_used_at TEXT,
        revoked_at TEXT
      );
      CREATE INDEX tokens_owner ON tokens (owner);`,
  },
  {
    version: 2,
    name: 'instances',
    sql: `
      CREATE TABLE instances (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        image TEXT NOT NULL,
        status TEXT NOT NULL,
        layers TEXT NOT NULL DEFAULT '[]',
        agent_layer TEXT NOT NULL,
        env TEXT NOT NULL DEFAULT '{}',
        limits TEXT NOT NULL DEFAULT '{}',
        metadata TEXT NOT NULL DEFAULT '{}',
        pid INTEGER,
        pid_start TEXT,
        source_instance_id TEXT,
        source_checkpoint_id TEXT,
        max_checkpoints INTEGER,
        head_checkpoint_id TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
      );
      CREATE INDEX instances_owner ON instances (owner, created_at);`,
  },
  {
    version: 3,
    name: 'checkpoints and layers',
    sql: `
      CREATE TABLE checkpoints (
        id TEXT PRIMARY KEY,
        instance_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        label TEXT,
        status TEXT NOT NULL,
        memory INTEGER NOT NULL,
        parent_id TEXT,
        layers TEXT NOT NULL DEFAULT '[]',
        image TEXT NOT NULL,
        agent_layer TEXT NOT NULL,
        hostname TEXT NOT NULL,
        delta_bytes INTEGER,
        memory_bytes INTEGER,
        error TEXT,
        created_at TEXT NOT NULL,
        ready_at TEXT
      );
      CREATE INDEX checkpoints_instance ON checkpoints (instance_id, created_at);
      CREATE TABLE layers (
        id TEXT PRIMARY KEY,
        created_at TEXT NOT NULL,
        synced INTEGER NOT NULL DEFAULT 0,
        -- set while an upper is being frozen into this layer, for crash recovery
        pending_instance_id TEXT
      );
      -- who stands on a layer: 'instance:<id>' or 'checkpoint:<id>'
      CREATE TABLE layer_refs (
        layer_id TEXT NOT NULL REFERENCES layers (id),
        holder TEXT NOT NULL,
        PRIMARY KEY (layer_id, holder)
      );
      CREATE INDEX layer_refs_holder ON layer_refs (holder);`,
  },
  {
    version: 4,
    name: 'checkpoint pause',
    sql: `ALTER TABLE checkpoints ADD COLUMN pause_ms REAL;`,
  },
  {
    version: 5,
    name: 'squashed base layers',
    sql: `
      -- 1 when the oldest layer of the chain is a squashed full root that replaces the image
      ALTER TABLE instances ADD COLUMN base_layer INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE checkpoints ADD COLUMN base_layer INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 6,
    name: 'hibernation and idle timeouts',
    sql: `
      -- the memory image of a hibernated instance (under checkpoints/), restored by its wake
      ALTER TABLE instances ADD COLUMN hibernation_id TEXT;
      -- seconds without activity after which a running instance hibernates by itself
      ALTER TABLE instances ADD COLUMN idle_timeout_s INTEGER;`,
  },
  {
    version: 7,
    name: 'executions',
    sql: `
      -- commands started to be streamed, attached to or waited for; their state while they run
      -- is the agent's, these rows keep what it does not (argv, times, the end once seen)
      CREATE TABLE executions (
        instance_id TEXT NOT NULL,
        id TEXT NOT NULL,
        process_id INTEGER NOT NULL,
        kind TEXT NOT NULL,
        argv TEXT NOT NULL,
        cwd TEXT NOT NULL,
        started_at TEXT NOT NULL,
        ended_at TEXT,
        exit_code INTEGER,
        signal INTEGER,
        timed_out INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (instance_id, id)
      );
      CREATE INDEX executions_started ON executions (instance_id, started_at);`,
  },
  {
    version: 8,
    name: 'networking',
    sql: `
      -- the instance's address on the sandboxes' network, and its egress policy (JSON)
      ALTER TABLE instances ADD COLUMN address TEXT;
      ALTER TABLE instances ADD COLUMN egress TEXT;
      -- host ports that lead to a port of an instance
      CREATE TABLE port_forwards (
        id TEXT PRIMARY KEY,
        instance_id TEXT NOT NULL,
        owner TEXT NOT NULL,
        guest_port INTEGER NOT NULL,
        host_port INTEGER NOT NULL UNIQUE,
        protocol TEXT NOT NULL,
        label TEXT,
        created_at TEXT NOT NULL
      );
      CREATE INDEX port_forwards_instance ON port_forwards (instance_id);`,
  },
  {
    version: 9,
    name: 'images and templates',
    sql: `
      -- the image name the instance was created from when it is not a rootfs directory (a built
      -- image or a template: \`image\` is then the directory under its layers); its working
      -- directory for commands (an image's WORKDIR)
      ALTER TABLE instances ADD COLUMN image_ref TEXT;
      ALTER TABLE instances ADD COLUMN workdir TEXT;
      -- images built from Dockerfiles or manifests: a rootfs directory and layers on it (newest
      -- first, each held by a layer_refs row 'image:<owner>/<name>'), and their configuration
      CREATE TABLE images (
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        base TEXT NOT NULL,
        layers TEXT NOT NULL,
        config TEXT NOT NULL,
        build_key TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (owner, name)
      );
      -- build steps already made: the layers after a step, by a hash of the parent and the step
      -- (held by 'cache:<owner>/<key>')
      CREATE TABLE build_cache (
        owner TEXT NOT NULL,
        key TEXT NOT NULL,
        layers TEXT NOT NULL,
        config TEXT NOT NULL,
        used_at TEXT NOT NULL,
        PRIMARY KEY (owner, key)
      );
      -- templates: a memory checkpoint of a hidden instance new instances are restored from
      CREATE TABLE templates (
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        instance_id TEXT,
        checkpoint_id TEXT,
        source TEXT NOT NULL,
        start_command TEXT,
        status TEXT NOT NULL,
        error TEXT,
        created_at TEXT NOT NULL,
        PRIMARY KEY (owner, name)
      );`,
  },
  {
    version: 10,
    name: 'lifetimes',
    sql: `
      -- when the instance ends by itself (E2B's sandbox timeout), and how: 'delete' or 'hibernate'
      ALTER TABLE instances ADD COLUMN expires_at TEXT;
      ALTER TABLE instances ADD COLUMN on_expiry TEXT;`,
  },
  {
    version: 11,
    name: 'durable checkpoints',
    sql: `
      -- checkpoints whose layers and memory image are in the object store, with their manifest
      CREATE TABLE durable_checkpoints (
        checkpoint_id TEXT PRIMARY KEY,
        manifest TEXT NOT NULL,
        uploaded_bytes INTEGER NOT NULL,
        durable_at TEXT NOT NULL
      );
      -- compressed blobs in the object store, by the sha256 of their bytes, and who uses them
      CREATE TABLE durable_blobs (sha TEXT PRIMARY KEY, bytes INTEGER NOT NULL, created_at TEXT NOT NULL);
      CREATE TABLE durable_refs (checkpoint_id TEXT NOT NULL, sha TEXT NOT NULL, PRIMARY KEY (checkpoint_id, sha));
      CREATE INDEX durable_refs_sha ON durable_refs (sha);
      -- the blob a frozen layer packed into (layers never change: packed once)
      CREATE TABLE layer_blobs (layer_id TEXT PRIMARY KEY, sha TEXT NOT NULL);`,
  },
  {
    version: 12,
    name: 'nodes',
    sql: `
      -- the servers sharing this store: where each is reached, and when it last said it lives
      CREATE TABLE nodes (id TEXT PRIMARY KEY, url TEXT NOT NULL, started_at TEXT NOT NULL, heartbeat_at TEXT NOT NULL);
      -- the node whose disk and processes the instance is on (null: from before nodes, the one
      -- server there was)
      ALTER TABLE instances ADD COLUMN node TEXT;
      CREATE INDEX instances_node ON instances (node);`,
  },
  {
    version: 13,
    name: 'shared secrets',
    sql: `
      -- secrets every node must hold the same (the key preview links and sandboxes' access
      -- tokens are signed with): the first node's, made or brought from its data directory
      CREATE TABLE secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL, created_at TEXT NOT NULL);`,
  },
  {
    version: 14,
    name: 'user namespaces',
    sql: `
      -- the first host uid and gid of the instance's range (its ids 0..65535 are the host's
      -- uid_base..uid_base+65535, in a user namespace of its own); null: none, the host's ids.
      -- Unique among all instances of every node: no two sandboxes ever share a range.
      ALTER TABLE instances ADD COLUMN uid_base INTEGER;
      CREATE UNIQUE INDEX instances_uid_base ON instances (uid_base);
      -- whether the checkpoint's memory image is of a tree in a user namespace: its forks and
      -- restores are made in the same mode (older checkpoints: without)
      ALTER TABLE checkpoints ADD COLUMN user_namespace INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 15,
    name: 'instance versions',
    sql: `
      -- how many writes the row has had: a status change is a compare-and-set on it (the
      -- lifecycle's), so that a write read before another's lands after it is refused, not kept
      ALTER TABLE instances ADD COLUMN version INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 16,
    name: 'restores under way',
    sql: `
      -- the checkpoint a restore (a rollback, a fork) is bringing the instance back from, while
      -- it runs: a server that stops meanwhile finishes it at its next start
      ALTER TABLE instances ADD COLUMN restoring_from TEXT;`,
  },
  {
    version: 17,
    name: 'node leases',
    sql: `
      -- the node's lease generation, its fencing token: raised when the node registers and when
      -- another node judges it silent (marks its instances lost). A write by a node carries the
      -- epoch it read; one of an epoch no longer current is refused.
      ALTER TABLE nodes ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 18,
    name: 'draining nodes',
    sql: `
      -- a node being drained: sent no new instances, and the instances it hands over (lost, with
      -- a durable checkpoint of the moment) are taken by the other nodes by themselves
      ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 19,
    name: 'registry credentials',
    sql: `
      -- an owner's credentials for a registry (host[:port]), used by that owner's pulls; the
      -- password sealed with the server's secrets key (AES-256-GCM), which is not in the store
      CREATE TABLE registry_credentials (
        owner TEXT NOT NULL,
        registry TEXT NOT NULL,
        username TEXT NOT NULL,
        sealed_password TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (owner, registry)
      );`,
  },
  {
    version: 20,
    name: 'pulled image sizes',
    sql: `
      -- what a pulled image weighed as fetched (its compressed layers and configuration): the
      -- owner's pulled images are bounded by their sum (null for built images)
      ALTER TABLE images ADD COLUMN pulled_bytes BIGINT;`,
  },
  {
    version: 21,
    name: 'persistent volumes',
    sql: `
      -- an owner's persistent volume: a size-limited filesystem on one node's disk, mounted by
      -- that owner's instances on that node; it outlives them
      CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        size_mb INTEGER NOT NULL,
        node TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (owner, name)
      );
      -- where an instance mounts which volume ([{volumeId, path, readOnly}], fixed at its
      -- creation; a null volumeId is an empty placeholder where its source had one)
      ALTER TABLE instances ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]';`,
  },
  {
    version: 22,
    name: 'owner secrets',
    sql: `
      -- an owner's secret, sealed with the server's secrets key; instances name the secrets
      -- their requests to some hosts carry (the egress proxy puts the value in), never the value
      CREATE TABLE owner_secrets (
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed_value TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (owner, name)
      );
      -- [{name, env, hosts, placeholder}]: what the sandbox sees is the placeholder
      ALTER TABLE instances ADD COLUMN secrets TEXT NOT NULL DEFAULT '[]';
      -- the instance's egress CA (certificate and key, sealed): forks keep their source's
      ALTER TABLE instances ADD COLUMN egress_ca TEXT;`,
  },
  {
    version: 23,
    name: 'warm forks',
    sql: `
      -- 1: it took a standby made ahead (a warm fork or create) instead of a restore or a boot
      ALTER TABLE instances ADD COLUMN warm_fork INTEGER NOT NULL DEFAULT 0;`,
  },
  {
    version: 24,
    name: 'default users',
    sql: `
      -- who its commands run as unless told (its image's USER, name or uid, with :group); null: root
      ALTER TABLE instances ADD COLUMN default_user TEXT;`,
  },
  {
    version: 25,
    name: 'secret stores',
    sql: `
      -- a named group of an owner's secrets (OpenComputer's secret store), with the egress
      -- allowlist ([host]) the instances made with it get
      CREATE TABLE secret_stores (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        name TEXT NOT NULL,
        egress_allowlist TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (owner, name)
      );
      -- a store's secret, sealed with the server's secrets key, and the hosts ([host]) whose
      -- requests carry it
      CREATE TABLE secret_store_entries (
        store_id TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed_value TEXT NOT NULL,
        allowed_hosts TEXT NOT NULL DEFAULT '[]',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (store_id, name)
      );`,
  },
  {
    version: 26,
    name: 'image volumes',
    sql: `
      -- its image's VOLUME paths ([path]): each mounted on itself in its sandbox, on its own disk
      ALTER TABLE instances ADD COLUMN image_volumes TEXT NOT NULL DEFAULT '[]';`,
  },
];

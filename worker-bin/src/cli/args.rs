//! The command line: global options (accepted before or after the subcommand) and one
//! struct per subcommand. Parsing only; nothing here touches a store.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use tranche_control::{ProbeStale, ProberConfig, Rate};

use crate::cli::common::{Global, parse_duration};
use crate::defaults::RunDefaults;

/// Range-partitioned batch work, coordinated through Redis or embedded in one process.
///
/// Plan an ID range once, then start `tranche run` on as many machines as you like:
/// workers claim partitions, run each one in chunks through a sliding window, and
/// every finished partition moves to a compressed archive that answers for it for ever.
#[derive(Debug, Parser)]
#[command(
    name = "tranche",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("TRANCHE_GIT_COMMIT"), ")"),
    propagate_version = true,
    max_term_width = 100
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Cut an ID range into partitions and register it (a repeated plan is a no-op).
    Plan(PlanArgs),
    /// Claim partitions and process them until none is left.
    Run(Box<RunArgs>),
    /// Run an archiver alone: drain completed partitions into the archive.
    Archive(ArchiveArgs),
    /// Partition counts by state, the archive and the workers.
    Status(StatusArgs),
    /// What happened to one partition.
    Get {
        /// The partition id.
        pid: u64,
    },
    /// Which partition covered row ID N, and what happened to it.
    Locate {
        /// The row id.
        id: u64,
    },
    /// Completed-partition statistics merged with live counts.
    Stats {
        /// Also every 100,000-ID range's statistics (a read that grows with the ID
        /// space; without it, global, per-worker and per-day statistics only).
        #[arg(long)]
        ranges: bool,
    },
    /// Registered workers and their last heartbeat.
    Workers,
    /// Stop every worker of the namespace from claiming (running partitions finish)
    /// until `resume` (Redis only).
    Pause,
    /// Let the workers of a paused namespace claim again.
    Resume,
    /// The namespace's plans: pids, ids, partition size, count, kind.
    Plans,
    /// The namespace's archive format: how archivers encode what they seal (Redis only).
    ///
    /// Format 1 is what every version reads. Format 2 (smaller segments) and format 3
    /// (format 2 with packed statistics ranges) are read only by the versions that write
    /// them and later: raise it once no older binary reads the namespace (an older
    /// `check --repair` would set values of a later format aside as damaged). A format is
    /// never lowered; what was archived before stays as it is.
    ArchiveFormat {
        /// Raise the format to N (1, 2 or 3); archivers follow within a sweep.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=3))]
        raise: Option<u8>,
    },
    /// Every namespace on the Redis (or beside the state file), with its size and state.
    Namespaces,
    /// A dashboard, a JSON API under /api/v1/ and Prometheus metrics on /metrics.
    Serve(ServeArgs),
    /// Delete the namespace and everything in it, for good.
    Drop {
        /// Yes, delete it.
        #[arg(long)]
        yes: bool,
        /// Even while workers are alive.
        #[arg(long)]
        force: bool,
    },
    /// Make failed partitions claimable again.
    RetryFailed {
        /// Only this partition (default: every failed one).
        pid: Option<u64>,
    },
    /// Drop one pending or failed partition for good.
    Discard {
        /// The partition id.
        pid: u64,
        /// Replace the partition's record whatever it holds, even one that does not
        /// decode (Redis; the record is lost).
        #[arg(long)]
        force: bool,
    },
    /// Write the whole archive to a dump file (or JSON lines).
    ///
    /// With --to-hash, write every archived partition back into one Redis hash of the
    /// seed's JSON instead (field pid), on the namespace's Redis.
    Export(ExportArgs),
    /// Restore a dump file into an empty namespace.
    ///
    /// FILE is a dump or the JSON lines of `export --jsonl`. With --from-hash (and
    /// --completed-hash), adopt a job kept in the seed's hashes of JSON on the
    /// namespace's Redis instead.
    Import(ImportArgs),
    /// Seal open archive batches now.
    Compact,
    /// Recompute statistics from the archive and report every difference.
    Check {
        /// Rewrite the statistics from the archive.
        #[arg(long)]
        repair: bool,
    },
    /// Evaluate the alert rules; exit non-zero naming each that fires.
    Health(HealthArgs),
    /// Partitions by state, a page at a time: worker, attempt, checkpoint, lease expiry,
    /// last error (every active state by default).
    List {
        /// Only partitions in this state (`--state` names the embedded state file).
        #[arg(value_enum, value_name = "STATE")]
        status: Option<crate::cli::list::ListState>,
        /// Only partitions this worker holds (or held).
        #[arg(long, value_name = "ID")]
        worker: Option<String>,
        /// Partitions after this pid (the `next` of the previous page).
        #[arg(long, value_name = "PID", default_value_t = 0)]
        after: u64,
        /// At most this many.
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        limit: u64,
    },
    /// Change the namespace's live settings: every worker applies them within 2 s,
    /// without restarting (Redis only; `none` clears one).
    Set(SetArgs),
    /// Turn the namespace's manual throttle on or off: while on, no new chunk starts
    /// on any worker (Redis only).
    #[command(subcommand)]
    Throttle(ThrottleCommand),
    /// The namespace's control record and its change log (Redis only).
    #[command(subcommand)]
    Control(ControlCommand),
    /// Records that can never be archived, set aside with the reason (per shard, oldest
    /// first).
    DeadLetters {
        /// At most this many per shard.
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// Check the Redis for what tranche needs, on every master of a cluster: version,
    /// eviction policy, persistence, replicas, clock, cluster slots, ACL and latency
    /// (one line each; exit 1 when one fails).
    Doctor(DoctorArgs),
    /// Print a shell completion script (e.g. `tranche completions bash >
    /// /etc/bash_completion.d/tranche`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `tranche man > /usr/local/share/man/man1/tranche.1`.
    Man,
    /// Print every command's help as Markdown (docs/cli.md is this output).
    #[command(hide = true)]
    CliMarkdown,
}

/// `plan`.
#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// First row ID.
    #[arg(long, value_name = "A")]
    pub(crate) min: u64,
    /// Last row ID, inclusive.
    #[arg(long, value_name = "B")]
    pub(crate) max: u64,
    /// Row IDs per partition.
    #[arg(long, value_name = "N", default_value_t = RunDefaults::RUN.partition_size)]
    pub(crate) size: u64,
    /// Print what the plan costs and write nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) tiers: TierArgs,
}

/// `run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// First row ID: with --max, plan the range first when the namespace has no plan
    /// (the same plan again resumes it; a different one is refused).
    #[arg(long, value_name = "A", requires = "max")]
    pub(crate) min: Option<u64>,
    /// Last row ID, inclusive (with --min).
    #[arg(long, value_name = "B", requires = "min")]
    pub(crate) max: Option<u64>,
    /// Row IDs per partition of the plan --min and --max make.
    #[arg(long, value_name = "N", requires = "min", default_value_t = RunDefaults::RUN.partition_size)]
    pub(crate) size: u64,
    /// Shell command run per chunk, with TRANCHE_PID, TRANCHE_FROM, TRANCHE_TO,
    /// TRANCHE_ATTEMPT and TRANCHE_CHUNK in its environment; exit 0 is success.
    #[arg(
        long,
        value_name = "CMD",
        conflicts_with_all = ["simulate", "sql"],
        required_unless_present_any = ["simulate", "sql", "exec_persistent"]
    )]
    pub(crate) exec: Option<String>,
    /// SQL statement run per chunk on PostgreSQL (--database-url), one transaction per
    /// chunk over a pool of warm connections: $1/:from and $2/:to bind the chunk's IDs,
    /// $3/:pid, $4/:attempt and $5/:fence the rest (all bigint). Prepared before any
    /// claim: a statement the database refuses fails the run at start. See docs/sql.md.
    #[arg(long, value_name = "STATEMENT", conflicts_with_all = ["exec", "simulate", "exec_persistent"], requires = "database_url")]
    pub(crate) sql: Option<String>,
    /// The database --sql runs on: a libpq connection string or postgresql:// URL
    /// (sslmode=verify-full or require for TLS, verified against the system's roots and
    /// sslrootcert=PATH if given; verify-ca leaves the name unchecked).
    #[arg(
        long,
        value_name = "URL",
        env = "TRANCHE_DATABASE_URL",
        hide_env_values = true
    )]
    pub(crate) database_url: Option<String>,
    /// At most N connections for --sql [default: --concurrency × --parallel].
    #[arg(long, value_name = "N", requires = "sql", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) db_connections: Option<u32>,
    /// A bigint column of the table --sql updates: each row written gets the chunk's
    /// fence, and rows already holding a fence as high are left alone, so a worker
    /// past its lease writes nothing over its successor's rows.
    #[arg(long, value_name = "COLUMN", requires = "sql")]
    pub(crate) fence_column: Option<String>,
    /// A constraint violation (SQLSTATE class 23) in --sql fails the partition at once
    /// instead of its attempt.
    #[arg(long, requires = "sql")]
    pub(crate) constraint_permanent: bool,
    /// Command kept running between chunks, one per chunk in flight: it reads one chunk
    /// a line on stdin as JSON ({"pid","chunk","from","to","attempt","fence"}) and
    /// answers one line on stdout, `ok`, `error: REASON` (the attempt fails) or
    /// `permanent: REASON` (the partition fails, no retry). See docs/persistent.md.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["exec", "simulate"])]
    pub(crate) exec_persistent: Option<String>,
    /// How long a chunk may take: an --exec-persistent process that has not answered by
    /// then is stopped (SIGTERM, the grace, SIGKILL) and the attempt fails; for --sql,
    /// each chunk's statement_timeout and lock_timeout [--sql's default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) chunk_timeout: Option<Duration>,
    /// LOAD GENERATOR, not real work: each chunk sleeps a random time and fails at the
    /// given rate (see --sim-latency, --sim-fail).
    #[arg(long)]
    pub(crate) simulate: bool,
    /// Simulated chunk latency, uniform in MIN..MAX milliseconds [default: 1..5].
    #[arg(long, value_name = "MIN..MAX", value_parser = parse_latency)]
    pub(crate) sim_latency: Option<(u64, u64)>,
    /// Simulated chunk failure rate, 0..=1 [default: 0].
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub(crate) sim_fail: Option<f64>,
    /// Row IDs per chunk.
    #[arg(long, value_name = "N", default_value_t = RunDefaults::RUN.chunk, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) chunk: u64,
    /// Chunks in flight per partition.
    #[arg(long, value_name = "N", default_value_t = RunDefaults::RUN.parallel, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) parallel: u32,
    /// Sliding window per partition, in chunks (default: twice --parallel).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) window: Option<u32>,
    /// Partitions processed at once by this process (a partition whose chunks are done
    /// reports its outcome without holding a slot).
    #[arg(long, value_name = "N", default_value_t = RunDefaults::RUN.concurrency, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) concurrency: u32,
    /// Partitions claimed ahead beyond --concurrency, so a finished one is replaced
    /// without waiting for Redis (default: as many as --concurrency while partitions take
    /// under a second, an eighth of it once they take longer).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=4096))]
    pub(crate) prefetch: Option<u32>,
    /// This worker's id (default: host-N, N the lowest slot free on this host, so a
    /// restarted worker takes its name back).
    #[arg(long, value_name = "ID")]
    pub(crate) worker_id: Option<String>,
    /// Never split: idle slots do not take over the rest of other workers' running
    /// partitions, and this worker's partitions are not cut for others.
    #[arg(long)]
    pub(crate) no_split: bool,
    /// The smallest piece a split cuts off, in chunks (fewer if they are slow).
    #[arg(long, value_name = "CHUNKS", default_value_t = RunDefaults::RUN.split_min, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) split_min: u64,
    /// Lease length: a partition whose worker stops heartbeating is reclaimed after it.
    #[arg(long, value_name = "DURATION", default_value = RunDefaults::RUN.lease, value_parser = parse_duration)]
    pub(crate) lease: Duration,
    /// Attempts before a partition is marked failed.
    #[arg(long, value_name = "N", default_value_t = RunDefaults::RUN.max_attempts, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_attempts: u32,
    /// First retry delay after a failure (doubling up to 5 min).
    #[arg(long, value_name = "DURATION", default_value = RunDefaults::RUN.backoff, value_parser = parse_duration)]
    pub(crate) backoff: Duration,
    /// How long in-flight chunks may finish after SIGINT/SIGTERM before they are killed.
    #[arg(long, value_name = "DURATION", default_value = RunDefaults::RUN.grace, value_parser = parse_duration)]
    pub(crate) grace: Duration,
    /// Keep waiting for new plans instead of stopping when nothing is left.
    #[arg(long)]
    pub(crate) follow: bool,
    /// Do not run the reaper (expired leases) in this process.
    #[arg(long)]
    pub(crate) no_reaper: bool,
    /// Do not run an archiver in this process.
    #[arg(long)]
    pub(crate) no_archiver: bool,
    /// Do not register this worker or send worker heartbeats.
    #[arg(long)]
    pub(crate) no_heartbeat: bool,
    /// Serve this worker's own Prometheus metrics (partitions in flight, completed,
    /// failed attempts, released, lost leases, partition durations) on ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub(crate) tiers: TierArgs,
    #[command(flatten)]
    pub(crate) snapshots: SnapshotArgs,
    #[command(flatten)]
    pub(crate) control: RunControlArgs,
}

/// Archive tier settings (`run`, `archive`).
#[derive(Debug, Clone, Args)]
pub(crate) struct TierArgs {
    /// Archived count from which records go to the compressed tier.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub(crate) compressed_at: u64,
    /// Archived count from which records go to the summary tier (batches expire).
    #[arg(long, value_name = "N", default_value_t = 500_000)]
    pub(crate) summary_at: u64,
    /// How long summary-tier batches live.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub(crate) summary_ttl: Duration,
}

impl TierArgs {
    /// The thresholds as the backend takes them.
    pub(crate) fn tiers(&self) -> crate::layers::Tiers {
        crate::layers::Tiers {
            compressed_at: self.compressed_at,
            summary_at: self.summary_at,
            summary_ttl: self.summary_ttl,
        }
    }
}

/// `archive`.
#[derive(Debug, Args)]
pub(crate) struct ArchiveArgs {
    /// Keep draining until interrupted instead of stopping once the inboxes are empty.
    #[arg(long)]
    pub(crate) follow: bool,
    #[command(flatten)]
    pub(crate) tiers: TierArgs,
    #[command(flatten)]
    pub(crate) snapshots: SnapshotArgs,
}

/// When the archiver publishes statistics snapshots (`run`, `archive`).
#[derive(Debug, Clone, Args)]
pub(crate) struct SnapshotArgs {
    /// Publish a statistics snapshot after this many archive batches (passes that
    /// archived something).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) snapshot_every: u32,
    /// Publish one after this long too, if anything was archived since the last.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub(crate) snapshot_interval: Duration,
    /// Never publish two snapshots closer together than this (each reads every
    /// statistic; under load ten batches pass in milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub(crate) snapshot_min_gap: Duration,
}

impl SnapshotArgs {
    /// The archiver's snapshot policy.
    pub(crate) fn policy(&self) -> tranche_archive_store::SnapshotPolicy {
        tranche_archive_store::SnapshotPolicy {
            every: self.snapshot_every,
            interval: self.snapshot_interval,
            min_gap: self.snapshot_min_gap,
        }
    }
}

/// `status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Refresh every interval until interrupted.
    #[arg(long)]
    pub(crate) watch: bool,
    /// Refresh interval of --watch.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    pub(crate) interval: Duration,
}

/// `export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// Where to write.
    #[arg(long, short, value_name = "FILE", required_unless_present = "to_hash")]
    pub(crate) output: Option<PathBuf>,
    /// JSON lines instead of a dump: a first line with the plans, then one seed-format
    /// record per partition.
    #[arg(long)]
    pub(crate) jsonl: bool,
    /// Instead of a file, HSET every archived partition into this Redis hash as the
    /// seed's JSON, field its pid (Redis only; running it again writes the same).
    #[arg(long, value_name = "KEY", conflicts_with_all = ["output", "jsonl"])]
    pub(crate) to_hash: Option<String>,
}

/// `import`.
#[derive(Debug, Args)]
pub(crate) struct ImportArgs {
    /// The dump (or JSON lines) written by `export`.
    #[arg(
        value_name = "FILE",
        required_unless_present_any = ["from_hash", "completed_hash"],
        conflicts_with_all = ["from_hash", "completed_hash"]
    )]
    pub(crate) file: Option<PathBuf>,
    /// Adopt the unfinished partitions of this Redis hash (field pid, value the seed's
    /// partition JSON: pending, claimed and running ones come back pending, failed ones
    /// failed, their attempts kept). Redis only.
    #[arg(long, value_name = "KEY")]
    pub(crate) from_hash: Option<String>,
    /// Adopt the completed partitions of this Redis hash (field pid, value the seed's
    /// record JSON) into the archive. Redis only.
    #[arg(long, value_name = "KEY")]
    pub(crate) completed_hash: Option<String>,
}

/// `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (beyond localhost, a --read-token or --admin-token is
    /// required).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7878")]
    pub(crate) listen: std::net::SocketAddr,
    /// Token that actions (retry, discard, pause, resume) must present as
    /// `Authorization: Bearer TOKEN`; without it the server is read-only. On the
    /// command line it shows in `ps`: prefer TRANCHE_ADMIN_TOKEN or --admin-token-file.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TRANCHE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub(crate) admin_token: Option<String>,
    /// Read the admin token from the first line of FILE instead (out of `ps` and of
    /// the environment).
    #[arg(
        long,
        value_name = "FILE",
        env = "TRANCHE_ADMIN_TOKEN_FILE",
        conflicts_with = "admin_token"
    )]
    pub(crate) admin_token_file: Option<std::path::PathBuf>,
    /// Token every read (GET) must present as `Authorization: Bearer`; the admin token
    /// reads too. Required beyond localhost (the admin token serves when not given).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "TRANCHE_READ_TOKEN",
        hide_env_values = true
    )]
    pub(crate) read_token: Option<String>,
}

/// `doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Check this ACL user's permissions instead of the connected one's (ACL DRYRUN
    /// needs an admin connection: run doctor as one and name the workers' user).
    #[arg(long, value_name = "USER")]
    pub(crate) acl_user: Option<String>,
}

/// `health`.
#[derive(Debug, Args)]
pub(crate) struct HealthArgs {
    /// Alert when more partitions than this are claimed or running.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub(crate) max_active: u64,
    /// Alert when the archive inboxes hold more entries than this.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) max_inbox: u64,
    /// Alert when worker update p99 exceeds this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100.0)]
    pub(crate) max_update_p99_ms: f64,
    /// Alert when more partitions than this have failed (out of attempts).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) max_failed: u64,
    /// Alert when failed partitions are more than this share of the planned ones.
    #[arg(long, value_name = "SHARE", default_value_t = 0.01)]
    pub(crate) max_failed_share: f64,
    /// Alert when work is outstanding and nothing was archived for this long (since the
    /// oldest live worker started, when nothing was ever archived).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub(crate) max_stall: Duration,
    /// Alert when the oldest completion waiting for the archiver is older than this (an
    /// archiver that is missing or falls behind; Redis only).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub(crate) max_archive_lag: Duration,
    /// Alert when a running partition whose lease is still renewed (its worker lives:
    /// a hung handler) has been held longer than this, or than 10 times the p99
    /// partition duration when that is longer.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub(crate) max_partition_time: Duration,
    /// Also recompute statistics from the archive (reads every record).
    #[arg(long)]
    pub(crate) check: bool,
}

fn parse_latency(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once("..").unwrap_or((s, s));
    let min: u64 = a
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not MIN..MAX milliseconds"))?;
    let max: u64 = b
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not MIN..MAX milliseconds"))?;
    if min > max {
        return Err(format!("`{s}`: MIN is above MAX"));
    }
    Ok((min, max))
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a rate between 0 and 1")),
    }
}

impl HealthArgs {
    /// The thresholds `health` uses when given no option (for `serve`).
    pub(crate) fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            health: HealthArgs,
        }
        <Only as clap::Parser>::parse_from(["health"]).health
    }
}

/// `run`'s production-control options.
#[derive(Debug, Clone, Args)]
#[command(group(
    clap::ArgGroup::new("probe_database")
        .args(["database_url", "probe_database_url"])
        .multiple(true)
))]
pub(crate) struct RunControlArgs {
    /// Fleet-wide limit of row IDs per second (N, N/s, N/m or N/h), shared by every
    /// worker of the namespace (through Redis, or in this process embedded).
    #[arg(long, value_name = "RATE", value_parser = parse_fleet_rate)]
    pub(crate) max_rate: Option<Rate>,
    /// Fleet-wide limit of partitions claimed per second (N, N/s, N/m or N/h).
    #[arg(long, value_name = "RATE", value_parser = parse_fleet_rate)]
    pub(crate) max_partitions_rate: Option<Rate>,
    /// Throttle probe: a shell command run every --throttle-interval by one worker of
    /// the namespace. Exit 0 is go (a number on its first stdout line is the metric of
    /// --keep-below), exit 1 throttles with the first stdout line as the reason, any
    /// other exit throttles and is reported.
    #[arg(
        long,
        value_name = "CMD",
        conflicts_with = "throttle_http",
        group = "keep_below_metric"
    )]
    pub(crate) throttle_exec: Option<String>,
    /// Throttle probe: an http:// or https:// URL; 2xx is go, 429 or 503 throttles,
    /// anything else (or no answer) throttles and is reported.
    #[arg(long, value_name = "URL")]
    pub(crate) throttle_http: Option<String>,
    /// A PEM file of the CA that signs --throttle-http's certificate (default: the
    /// system's roots).
    #[arg(long, value_name = "FILE", requires = "throttle_http")]
    pub(crate) throttle_ca: Option<std::path::PathBuf>,
    /// How often the probe runs (100ms to 20m).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval)]
    pub(crate) throttle_interval: Duration,
    /// What a probe finding nobody renews (its prober died or stalled) means: throttle
    /// the fleet until a prober reports again, or go as if no probe were set.
    #[arg(long, value_name = "throttle|go", default_value = "throttle", value_parser = parse_probe_stale)]
    pub(crate) probe_stale: ProbeStale,
    /// The database the SQL probes (--throttle-sql, --throttle-pg, --keep-below-sql)
    /// run on [default: --database-url]: a replica, for MySQL's SHOW REPLICA STATUS
    /// (Seconds_Behind_Source), which a primary answers with no row.
    #[arg(
        long,
        value_name = "URL",
        env = "TRANCHE_PROBE_DATABASE_URL",
        hide_env_values = true
    )]
    pub(crate) probe_database_url: Option<String>,
    /// Throttle probe: a query on the probe database (its own connection). A true or a
    /// non-empty text in the first column throttles with that text as the reason;
    /// no row, NULL, false or empty is go; an error or no answer throttles.
    #[arg(long, value_name = "QUERY", requires = "probe_database", conflicts_with_all = ["throttle_exec", "throttle_http"])]
    pub(crate) throttle_sql: Option<String>,
    /// PostgreSQL's throttle indicators on the probe database, comma-separated: lag=5s
    /// (replication lag), autovacuum (on table=NAME), wal=64MB/s (WAL rate), xact=10m
    /// (the oldest open transaction). Each throttles with its reading as the reason.
    #[arg(long, value_name = "LIST", requires = "probe_database", conflicts_with_all = ["throttle_exec", "throttle_http"])]
    pub(crate) throttle_pg: Option<String>,
    /// The metric of --keep-below as a query on the probe database: a number in the
    /// first column (e.g. replica lag in seconds); no row, NULL or an error throttles.
    #[arg(long, value_name = "QUERY", requires_all = ["probe_database", "keep_below"], conflicts_with = "throttle_http", group = "keep_below_metric")]
    pub(crate) keep_below_sql: Option<String>,
    /// Adjust the fleet's ID rate (additive increase, multiplicative decrease, at most
    /// --max-rate) so that the number --throttle-exec prints (or --keep-below-sql
    /// answers) stays below N.
    #[arg(long, value_name = "N", requires = "keep_below_metric")]
    pub(crate) keep_below: Option<f64>,
    /// Claim and start work only within HH:MM-HH:MM (wrapping midnight, e.g.
    /// 22:00-06:00); outside it the worker waits and says until when.
    #[arg(long, value_name = "HH:MM-HH:MM")]
    pub(crate) active_hours: Option<String>,
    /// The time zone of --active-hours (an IANA name such as Europe/Paris; default the
    /// system's).
    #[arg(long, value_name = "ZONE", requires = "active_hours")]
    pub(crate) tz: Option<String>,
    /// Size each partition's chunks so each takes about this long (the first from
    /// --chunk, later ones and split pieces from the size learned, between --chunk-min
    /// and --chunk-max), keeping the window's checkpoint exact.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) chunk_time: Option<Duration>,
    /// The smallest chunk --chunk-time makes.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "chunk_time", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) chunk_min: u64,
    /// The largest chunk --chunk-time makes.
    #[arg(long, value_name = "N", default_value_t = 1_000_000, requires = "chunk_time", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) chunk_max: u64,
}

/// A rate (N, N/s, N/m or N/h).
fn parse_fleet_rate(s: &str) -> Result<Rate, String> {
    s.parse::<Rate>().map_err(|e| e.to_string())
}

/// A probe interval, bounded as [`ProberConfig::check`] bounds it.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let interval = parse_duration(s).map_err(|e| e.to_string())?;
    ProberConfig {
        worker: "-".to_owned(),
        interval,
        max_rate: None,
        floor: 1.0,
    }
    .check()
    .map_err(|e| e.to_string())?;
    Ok(interval)
}

/// `throttle` or `go`.
fn parse_probe_stale(s: &str) -> Result<ProbeStale, String> {
    s.parse::<ProbeStale>().map_err(|e| e.to_string())
}

/// `set`: the namespace's live settings, applied by every worker within 2 s. Each
/// option takes `none` to clear it (the workers' own options are in force again).
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// Row IDs per second, fleet-wide (N, N/s, N/m, N/h, or none).
    #[arg(long, value_name = "RATE")]
    pub(crate) max_rate: Option<String>,
    /// Partitions claimed per second, fleet-wide (or none).
    #[arg(long, value_name = "RATE")]
    pub(crate) max_partitions_rate: Option<String>,
    /// Partitions each worker runs at once (or none).
    #[arg(long, value_name = "N")]
    pub(crate) concurrency: Option<String>,
    /// Row IDs per chunk, for partitions started from now on (or none).
    #[arg(long, value_name = "N")]
    pub(crate) chunk: Option<String>,
    /// Chunks of one partition in flight, applied in flight up to each partition's
    /// window (or none).
    #[arg(long, value_name = "N")]
    pub(crate) parallel: Option<String>,
    /// Size chunks to take this long (a duration, or none).
    #[arg(long, value_name = "DURATION")]
    pub(crate) chunk_time: Option<String>,
    /// The smallest chunk of --chunk-time (or none).
    #[arg(long, value_name = "N")]
    pub(crate) chunk_min: Option<String>,
    /// The largest chunk of --chunk-time (or none).
    #[arg(long, value_name = "N")]
    pub(crate) chunk_max: Option<String>,
    /// The probe metric the fleet's rate is adjusted to stay below (or none).
    #[arg(long, value_name = "N")]
    pub(crate) keep_below: Option<String>,
    /// HH:MM-HH:MM outside which nothing is claimed or started (or none).
    #[arg(long, value_name = "HH:MM-HH:MM")]
    pub(crate) active_hours: Option<String>,
    /// The time zone of --active-hours.
    #[arg(long, value_name = "ZONE", requires = "active_hours")]
    pub(crate) tz: Option<String>,
}

/// `throttle`.
#[derive(Debug, Subcommand)]
pub(crate) enum ThrottleCommand {
    /// Start no new chunk on any worker of the namespace until `throttle off`
    /// (chunks in flight finish; leases are kept).
    On {
        /// Why, shown by `status` as "throttled since T: REASON".
        #[arg(long, default_value = "manual throttle")]
        reason: String,
    },
    /// Lift the manual throttle.
    Off,
}

/// `control`.
#[derive(Debug, Subcommand)]
pub(crate) enum ControlCommand {
    /// The last changes of the namespace's control record (time, origin, change).
    Log {
        /// At most this many (the log keeps the last 100).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
    },
    /// The control record in force: settings, throttles, the probe's last finding.
    Show,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_and_rate() {
        assert_eq!(parse_latency("1..5"), Ok((1, 5)));
        assert_eq!(parse_latency("7"), Ok((7, 7)));
        assert!(parse_latency("5..1").is_err());
        assert_eq!(parse_rate("0.25"), Ok(0.25));
        assert!(parse_rate("1.5").is_err());
    }

    #[test]
    fn global_options_go_before_or_after_the_subcommand() {
        let before = Cli::try_parse_from(["tranche", "--namespace", "x", "stats"]).unwrap();
        let after = Cli::try_parse_from(["tranche", "stats", "--namespace", "x"]).unwrap();
        assert_eq!(before.global.namespace, "x");
        assert_eq!(after.global.namespace, "x");
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}

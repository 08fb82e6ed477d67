//! `Job::check` from the library: the consistency check `tranche check` prints, as a
//! typed report, on both backends; on Redis through damage and its repair.

use crate::support;

use std::time::Duration;

use support::TestRedis;
use tranche_worker::{Chunk, Handler, HandlerError, Plan, Runner};

struct Done;

#[async_trait::async_trait]
impl Handler for Done {
    async fn process(&self, _: Chunk) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Plans 10 partitions of `runner`'s namespace and runs them to the end.
async fn ran(runner: &Runner) {
    runner
        .plan(Plan::ids(1..=10_000).partition_size(1000))
        .await
        .unwrap();
    let report = runner
        .clone()
        .backoff(Duration::from_millis(10))
        .run(Done)
        .await
        .unwrap();
    assert_eq!(report.this_runner.completed, 10, "{report:?}");
}

/// A job run to its end checks clean: nothing found, every archived record read.
async fn checks_clean(runner: &Runner) {
    let job = runner.job().await.unwrap();
    let report = job.check(false).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.records, 10, "{report:?}");
    assert_eq!(
        (report.dead_letters(), report.damaged_values()),
        (0, 0),
        "{report:?}"
    );
    assert!(!report.repaired && report.left.is_empty(), "{report:?}");
    // A repair of a clean namespace finds and changes nothing.
    let repaired = job.check(true).await.unwrap();
    assert!(repaired.is_clean() && repaired.repaired, "{repaired:?}");
    assert_eq!(repaired.records, 10);
}

#[tokio::test]
async fn a_finished_job_checks_clean_embedded() {
    let dir = std::env::temp_dir().join(format!("tranche-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runner = Runner::embedded(dir.join("c.state")).namespace("c");
    ran(&runner).await;
    checks_clean(&runner).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// On Redis: clean after the run; a statistics value that does not decode is found
/// (and named as a difference-free damage), repaired from the archive, and the job
/// checks clean again with every record counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_finds_and_repairs_damage_on_redis() {
    let redis = TestRedis::start();
    let runner = Runner::redis(redis.url()).namespace("c").shards(2);
    ran(&runner).await;
    checks_clean(&runner).await;

    let schema = tranche_codec::KeySchema::new("c", 2).unwrap();
    let _: i64 = redis.query(
        redis::cmd("HSET")
            .arg(schema.stats(1, "global"))
            .arg("count")
            .arg("many"),
    );
    let job = runner.job().await.unwrap();
    let found = job.check(false).await.unwrap();
    assert!(!found.is_clean(), "{found:?}");
    assert!(found.damaged_values() >= 1, "{found:?}");
    assert!(!found.repaired);

    let repaired = job.check(true).await.unwrap();
    assert!(
        repaired.repaired && repaired.left.is_empty(),
        "{repaired:?}"
    );
    let after = job.check(false).await.unwrap();
    assert!(after.is_clean(), "{after:?}");
    assert_eq!(after.records, 10, "{after:?}");

    // A kept count off by one is a difference, named by its path; the repair
    // recounts it.
    let _: i64 = redis.query(
        redis::cmd("HINCRBY")
            .arg(schema.stats(0, "global"))
            .arg("count")
            .arg(1),
    );
    let off = job.check(false).await.unwrap();
    assert!(
        off.differences
            .iter()
            .any(|d| d.path.contains("total_completed")),
        "{off:?}"
    );
    job.check(true).await.unwrap();
    assert!(job.check(false).await.unwrap().is_clean());
}

//! The dashboard in a real browser: Debian's chromium, driven through chromedriver
//! (`cargo xtask test` installs both when missing, as it does redis-server). A job runs
//! while the page is open: the progress moves, a failed partition is retried with the
//! admin token, a row id is found, and the page never shows an API error. On failure a
//! screenshot is saved under `target/`.

#[path = "../../active-store/tests/support/mod.rs"]
mod support;

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ok, scratch, tranche};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use support::TestRedis;

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn which(name: &str) -> String {
    let found = ["/usr/bin", "/usr/local/bin", "/usr/lib/chromium"]
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| std::path::Path::new(p).exists());
    found.unwrap_or_else(|| {
        panic!("{name} not found: run `cargo xtask test` (it installs chromium and chromium-driver) or apt-get install chromium chromium-driver")
    })
}

/// Polls `f` until it returns `Some`, for at most `limit`.
async fn until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn text(client: &Client, css: &str) -> String {
    match client.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    let redis = TestRedis::start();
    let dir = scratch("browser");
    let url = redis.url();
    let cmd = |args: &[&str]| tranche(&dir, &[&["--redis", &url][..], args].concat());
    ok(cmd(&[
        "plan", "--min", "1", "--max", "60000", "--size", "1000",
    ]));
    // Slow enough to watch, failing some partitions for good.
    let _run = Killed(
        cmd(&[
            "run",
            "--simulate",
            "--sim-latency",
            "20..40",
            "--sim-fail",
            "0.03",
            "--max-attempts",
            "1",
            "--concurrency",
            "2",
            "--parallel",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let mut serve = cmd(&["serve", "--listen", "127.0.0.1:0", "--admin-token", "t0ken"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _serve = Killed(serve);
    let page = line.trim().rsplit(' ').next().unwrap().to_owned();

    let port = free_port();
    let _driver = Killed(
        Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": which("chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"],
        }),
    );
    let webdriver = format!("http://127.0.0.1:{port}");
    let client = until(Duration::from_secs(30), "chromedriver", || {
        let (caps, webdriver) = (caps.clone(), webdriver.clone());
        async move {
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&webdriver)
                .await
                .ok()
        }
    })
    .await;

    let result = drive(&client, &page).await;
    if let Err(err) = &result {
        let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-failure.png");
        if let Ok(png) = client.screenshot().await {
            let _ = std::fs::write(&shot, png);
        }
        let _ = client.clone().close().await;
        panic!("{err} (screenshot: {})", shot.display());
    }
    let _ = client.close().await;
}

async fn drive(client: &Client, page: &str) -> Result<(), String> {
    client.goto(page).await.map_err(|e| e.to_string())?;
    // The progress moves while the job runs.
    let finished = |t: String| t.split(' ').next().and_then(|n| n.parse::<u64>().ok());
    let first = until(
        Duration::from_secs(30),
        "a first progress reading",
        || async { finished(text(client, "#done").await) },
    )
    .await;
    let later = until(Duration::from_secs(60), "the progress to move", || async {
        finished(text(client, "#done").await).filter(|&n| n > first)
    })
    .await;
    if later <= first {
        return Err(format!("progress did not move: {first} then {later}"));
    }
    // The job ends (nothing unissued, pending, claimed or running); its failed
    // partitions are listed with a Retry button.
    until(Duration::from_secs(90), "the job to finish", || async {
        let cells = client
            .find_all(Locator::Css("#counts tbody td"))
            .await
            .ok()?;
        let mut counts = Vec::new();
        for c in cells.iter().take(4) {
            counts.push(c.text().await.ok()?.trim().parse::<u64>().ok()?);
        }
        (counts.len() == 4 && counts.iter().all(|&n| n == 0)).then_some(())
    })
    .await;
    // The failed table refreshes on the next poll.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let rows = client
        .find_all(Locator::Css("#failed tbody tr"))
        .await
        .map_err(|e| e.to_string())?;
    if rows.is_empty() {
        // A run without a failure is possible (3% per chunk): nothing to retry then.
        return search(client).await;
    }
    let pid = rows[0]
        .find(Locator::Css("td"))
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let token = client
        .find(Locator::Id("token"))
        .await
        .map_err(|e| e.to_string())?;
    token.send_keys("t0ken").await.map_err(|e| e.to_string())?;
    let retry = rows[0]
        .find(Locator::Css("button.act"))
        .await
        .map_err(|e| e.to_string())?;
    retry.click().await.map_err(|e| e.to_string())?;
    let said = until(Duration::from_secs(20), "the action's answer", || async {
        let t = text(client, "#action-result").await;
        (!t.is_empty()).then_some(t)
    })
    .await;
    if !said.contains("retried") || !said.contains(&pid) {
        return Err(format!("retry of {pid} answered {said:?}"));
    }
    search(client).await?;
    let rate = text(client, "#rate").await;
    if rate.contains("cannot read the API") {
        return Err(format!("the page shows an API error: {rate}"));
    }
    Ok(())
}

async fn search(client: &Client) -> Result<(), String> {
    let q = client
        .find(Locator::Id("q"))
        .await
        .map_err(|e| e.to_string())?;
    q.send_keys("r7500").await.map_err(|e| e.to_string())?;
    client
        .find(Locator::Css("#search button"))
        .await
        .map_err(|e| e.to_string())?
        .click()
        .await
        .map_err(|e| e.to_string())?;
    let found = until(Duration::from_secs(20), "the search answer", || async {
        let t = text(client, "#found").await;
        (!t.is_empty()).then_some(t)
    })
    .await;
    if !found.contains("\"pid\": 8") {
        return Err(format!("row 7500 should be partition 8: {found}"));
    }
    Ok(())
}

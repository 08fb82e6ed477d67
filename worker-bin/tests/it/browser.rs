//! The dashboard in a real browser: Debian's chromium, driven through chromedriver
//! (`cargo xtask test` installs both when missing, as it does redis-server). A job runs
//! while the page is open: the progress moves, the throughput chart and durations fill
//! in, a failed partition (13 and 29 fail) is opened on its own page and retried with the
//! admin token, a row id is found, archived partitions page, at 1400 px every card
//! fits (no table scrolls) and the control card shows what `tranche set` changed, the
//! page fits a narrow screen, and no script error or failed API read happens the whole
//! time. On failure a
//! screenshot is saved under `target/`.

use crate::support;

use crate::common;

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

/// Polls `f` until it returns `Some`, for at most `limit`; an error naming `what`
/// after that (so the caller can still take its screenshot).
async fn until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out waiting for {what}"));
        }
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
    ok(cmd(&["set", "--max-rate", "1000000"]));
    // Slow enough to watch; partitions 13 and 29 fail for good.
    let _run = Killed(
        cmd(&[
            "run",
            "--exec",
            r#"sleep 0.25; test "$TRANCHE_PID" != 13 && test "$TRANCHE_PID" != 29"#,
            "--max-attempts",
            "1",
            "--chunk",
            "1000",
            "--concurrency",
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
    .await
    .expect("chromedriver");

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

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

async fn drive(client: &Client, page: &str) -> Result<(), String> {
    client.goto(page).await.map_err(e)?;
    // The progress moves while the job runs.
    let finished = |t: String| t.split(' ').next().and_then(|n| n.parse::<u64>().ok());
    let first = until(
        Duration::from_secs(30),
        "a first progress reading",
        || async { finished(text(client, "#done").await) },
    )
    .await?;
    let later = until(Duration::from_secs(60), "the progress to move", || async {
        finished(text(client, "#done").await).filter(|&n| n > first)
    })
    .await?;
    if later <= first {
        return Err(format!("progress did not move: {first} then {later}"));
    }
    // At 1400 px every card holds its tables, and the control card says what is set.
    client.set_window_size(1400, 1000).await.map_err(e)?;
    until(Duration::from_secs(10), "the control card", || async {
        let kv = text(client, "#control-kv").await;
        (kv.contains("1000000 ids/s (set)")
            && text(client, "#control-log").await.contains("max_rate"))
        .then_some(())
    })
    .await?;
    let clipped = client
        .execute(
            "return [...document.querySelectorAll('.scroll')].filter((s) => s.scrollWidth > s.clientWidth + 1).map((s) => s.firstElementChild.id)",
            vec![],
        )
        .await
        .map_err(e)?;
    if clipped != serde_json::json!([]) {
        return Err(format!("tables scroll at 1400 px: {clipped}"));
    }
    let state = text(client, "#control-state").await;
    if !state.starts_with("Open") {
        return Err(format!("the control card says {state:?} with no throttle"));
    }
    // The job ends (nothing unissued, pending, claimed or running).
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
    .await?;
    // The throughput chart has a bar for this hour and the durations are filled in.
    until(Duration::from_secs(10), "the throughput chart", || async {
        let bars = client.find_all(Locator::Css("#chart rect")).await.ok()?;
        (bars.len() == 24).then_some(())
    })
    .await?;
    let durations = text(client, "#durations").await;
    if !durations.contains("p99") || durations.contains("p99\n-") {
        return Err(format!("no durations: {durations:?}"));
    }
    // The failed partitions are listed (the default filter); open one.
    let pids = until(
        Duration::from_secs(20),
        "both failed partitions",
        || async {
            let links = client
                .find_all(Locator::Css("#partitions tbody td a"))
                .await
                .ok()?;
            let mut pids = Vec::new();
            for l in &links {
                pids.push(l.text().await.ok()?);
            }
            (pids == ["13", "29"]).then_some(pids)
        },
    )
    .await?;
    client
        .find(Locator::LinkText(&pids[0]))
        .await
        .map_err(e)?
        .click()
        .await
        .map_err(e)?;
    let title = until(Duration::from_secs(20), "the partition's page", || async {
        let t = text(client, "#found-title").await;
        (!t.is_empty()).then_some(t)
    })
    .await?;
    if title != "13 (failed)" {
        return Err(format!("partition 13's page says {title:?}"));
    }
    if !client
        .current_url()
        .await
        .map_err(e)?
        .as_str()
        .ends_with("#pid=13")
    {
        return Err("a partition's page has no address of its own".into());
    }
    // Retry it with the token.
    let token = client.find(Locator::Id("token")).await.map_err(e)?;
    token.send_keys("t0ken").await.map_err(e)?;
    let rows = client
        .find_all(Locator::Css("#partitions tbody tr"))
        .await
        .map_err(e)?;
    let retry = rows
        .first()
        .ok_or("no failed row")?
        .find(Locator::Css("button.act"))
        .await
        .map_err(e)?;
    retry.click().await.map_err(e)?;
    let said = until(Duration::from_secs(20), "the action's answer", || async {
        let t = text(client, "#action-result").await;
        (!t.is_empty()).then_some(t)
    })
    .await?;
    if !said.contains("retried") || !said.contains("13") {
        return Err(format!("retry of 13 answered {said:?}"));
    }
    search(client).await?;
    // Filters and paging: archived partitions, 50 a page, then the next page.
    client
        .find(Locator::Css("#state option[value=archived]"))
        .await
        .map_err(e)?
        .click()
        .await
        .map_err(e)?;
    until(
        Duration::from_secs(20),
        "the first page of archived",
        || async {
            let info = text(client, "#page-info").await;
            info.starts_with("page 1, pids 1 to").then_some(())
        },
    )
    .await?;
    client
        .find(Locator::Id("next"))
        .await
        .map_err(e)?
        .click()
        .await
        .map_err(e)?;
    until(
        Duration::from_secs(20),
        "the second page of archived",
        || async {
            text(client, "#page-info")
                .await
                .starts_with("page 2, pids ")
                .then_some(())
        },
    )
    .await?;
    // A phone-sized window: nothing wider than the screen but the tables' own scroll.
    client.set_window_size(390, 844).await.map_err(e)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fits = client
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1",
            vec![],
        )
        .await
        .map_err(e)?;
    if fits != serde_json::Value::Bool(true) {
        return Err("the page is wider than a narrow screen".into());
    }
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-narrow.png");
    let _ = std::fs::write(&shot, client.screenshot().await.map_err(e)?);
    // No script error and no failed API read the whole time.
    let errors = client
        .execute("return window.__errors", vec![])
        .await
        .map_err(e)?;
    if errors != serde_json::json!([]) {
        return Err(format!("the page logged errors: {errors}"));
    }
    Ok(())
}

async fn search(client: &Client) -> Result<(), String> {
    let q = client.find(Locator::Id("q")).await.map_err(e)?;
    q.clear().await.map_err(e)?;
    q.send_keys("r7500").await.map_err(e)?;
    client
        .find(Locator::Css("#search button"))
        .await
        .map_err(e)?
        .click()
        .await
        .map_err(e)?;
    let found = until(Duration::from_secs(20), "the search answer", || async {
        let t = text(client, "#found-title").await;
        t.starts_with("8 ").then_some(t)
    })
    .await?;
    if found != "8 (completed)" {
        return Err(format!(
            "row 7500 should be in partition 8, completed: {found}"
        ));
    }
    Ok(())
}

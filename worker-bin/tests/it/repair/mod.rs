//! Damage is repaired, never fatal (issue 22, item 2), through the real binary: one
//! corrupt statistics value stalls its shard's archive alone, `tranche archive` ends
//! naming it, `health` fires, `check` reports it and `check --repair` rebuilds it from
//! the archive; and a partition held past its expected time with live heartbeats
//! fires `health` until it ends; a damaged archived value is reported and set aside;
//! `run` ends on a stalled shard; an outage is forgotten by the update-latency rule.

use crate::support;

use crate::common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, ok, output, scratch, tranche};
use serde_json::Value;
use support::TestRedis;

mod health;
mod records;
mod shards;

/// `health --json EXTRA`: the firing rules' names and their details, with the exit
/// code checked against them.
fn firing(cmd: &dyn Fn(&[&str]) -> std::process::Command, extra: &[&str]) -> Vec<(String, String)> {
    let out = output(cmd(&[&["health", "--json"][..], extra].concat()));
    let rules: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let fired: Vec<(String, String)> = rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["firing"] == true)
        .map(|r| {
            (
                r["rule"].as_str().unwrap().to_owned(),
                r["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = if fired.is_empty() { 0 } else { 1 };
    assert_eq!(out.status.code(), Some(expected), "{stderr}");
    fired
}

fn names(fired: &[(String, String)]) -> Vec<&str> {
    fired.iter().map(|(n, _)| n.as_str()).collect()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running `tranche serve`, killed on drop.
struct Serve(std::process::Child, String);

impl Serve {
    fn start(mut cmd: std::process::Command) -> Self {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn serve");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .rsplit("http://")
            .next()
            .and_then(|a| a.strip_suffix('/'))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Self(child, addr)
    }

    /// The value of the unlabelled gauge `name` on `/metrics`.
    fn gauge(&self, name: &str) -> f64 {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.1).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.1).unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        raw.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in {raw}"))
            .parse()
            .unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process killed on drop, so a failing test leaves no `tranche` behind.
struct Reaped(std::process::Child);

impl std::ops::Deref for Reaped {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn xlen(redis: &TestRedis, key: &str) -> u64 {
    redis.query(redis::cmd("XLEN").arg(key))
}

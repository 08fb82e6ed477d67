//! The faults: picking the next one from the seeded menu, injecting it (signals, the
//! proxy's modes, Redis restarts and failovers, corrupt bytes) and healing it.

use super::*;

/// XORs one byte (index `ARGV[2]` modulo the length) of hash field `ARGV[1]` with
/// 0x5a if the field exists and is not empty; replies `{index, new value}` or nil.
const FLIP_ONE_BYTE: &str = r"
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v or #v == 0 then return false end
local i = tonumber(ARGV[2]) % #v
local b = string.char(bit.bxor(string.byte(v, i + 1), 0x5a))
v = string.sub(v, 1, i) .. b .. string.sub(v, i + 2)
redis.call('HSET', KEYS[1], ARGV[1], v)
return {i, v}
";

impl Soak {
    /// Picks and injects the next fault; what heals it, if anything.
    pub(super) fn inject(
        &mut self,
        rng: &mut Rng,
        bag: &mut Vec<String>,
    ) -> Result<Option<Active>> {
        // A seeded shuffle of the menu, drawn from until empty: every kind comes once
        // per round, so a short run still meets each.
        if bag.is_empty() {
            *bag = self.opts.faults.clone();
            for i in (1..bag.len()).rev() {
                bag.swap(i, rng.below(i + 1));
            }
        }
        let kind = bag.pop().expect("the menu is not empty");
        let at = self.secs();
        let before = self.faults.len();
        match self.inject_one(&kind, at, rng) {
            Ok(active) => Ok(active),
            Err(err) => {
                eprintln!("xtask: soak: a fault could not be injected: {err:#}");
                // Recorded whatever the step that failed: `every_fault_injected` fails.
                if self.faults.len() == before {
                    let mut fault = Fault::new(&kind, at);
                    fault.missed = Some(format!("injection error: {err:#}"));
                    self.faults.push(fault);
                }
                Ok(None)
            }
        }
    }

    /// Injects one fault of `kind`; what heals it, if anything.
    fn inject_one(&mut self, kind: &str, at: f64, rng: &mut Rng) -> Result<Option<Active>> {
        let kind = kind.to_owned();
        let live: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].child.is_some() && !self.slots[i].stopped)
            .filter(|&i| self.opts.target.is_none_or(|k| self.slots[i].kind == k))
            .collect();
        let mut fault = Fault::new(&kind, at);
        let mut undo = Undo::Nothing;
        let mut taken_over = None;
        match kind.as_str() {
            "kill" | "stop" => {
                if live.is_empty() {
                    fault.missed = Some("no live worker to signal".into());
                    self.faults.push(fault);
                    return Ok(None);
                }
                let i = live[rng.below(live.len())];
                let name = self
                    .incarnations
                    .iter()
                    .rev()
                    .find(|x| Some(x.pid) == self.slots[i].pid());
                fault.target = name.map_or(String::new(), |x| x.name.clone());
                // Aimed: frozen at a moment one of its chunks is open, which the strike
                // (a kill, or the freeze kept) then lands on.
                let mut frozen_open = Vec::new();
                if self.opts.aim {
                    let mid_lines;
                    (frozen_open, mid_lines) = self.freeze_mid_chunk(i, &fault.target);
                    if frozen_open.is_empty() {
                        fault.missed = Some(format!(
                            "{} had no chunk open for {AIM_FOR:?}",
                            fault.target
                        ));
                        self.faults.push(fault);
                        return Ok(None);
                    }
                    fault.note = format!("with {} chunk(s) open; ", frozen_open.len());
                    if mid_lines > 0 {
                        fault.note.push_str(&format!(
                            "{mid_lines} freeze(s) mid-line thawed before it; "
                        ));
                    }
                }
                if kind == "kill" {
                    self.slots[i].kill(&mut self.incarnations);
                    // Whatever its chunks left behind is looked for once their
                    // watchers have had the time to kill their groups.
                    if let Some(inc) = self
                        .incarnations
                        .iter()
                        .rev()
                        .find(|x| x.name == fault.target)
                    {
                        self.orphan_checks.push((
                            inc.name.clone(),
                            self.slots[i].index,
                            Instant::now() + ORPHAN_CHECK,
                        ));
                    }
                    self.slots[i].restart_at = Some(Instant::now() + Duration::from_secs(1));
                    if self.opts.embedded {
                        // The embedded process comes back as `tranche run --exec`.
                        self.slots[i].next_kind = Some(Kind::Exec);
                    }
                } else {
                    fleet::signal(self.slots[i].pid().unwrap_or(0), "STOP");
                    self.slots[i].stopped = true;
                    undo = Undo::Cont(i);
                    if self.opts.aim {
                        // Held until another worker has started a chunk over one it
                        // froze: what its thaw then races with.
                        fault.note.push_str("held until another worker takes over");
                        taken_over = Some(TakeOver {
                            slot: i,
                            ranges: frozen_open,
                            after_us: now_us(),
                        });
                    }
                }
            }
            "panic" if self.opts.embedded => {
                // The one process holds the state file: for a handler to panic, it
                // becomes the library runner (a drained stop, then a start), until the
                // next kill brings `tranche run --exec` back.
                let slot = &mut self.slots[0];
                if slot.kind == Kind::Exec || slot.child.is_none() {
                    if slot.stopped {
                        fault.missed = Some("the one process is frozen".into());
                        self.faults.push(fault);
                        return Ok(None);
                    }
                    slot.terminate(Duration::from_secs(10), &mut self.incarnations);
                    slot.next_kind = Some(Kind::Runner);
                    slot.start(&self.setup, &mut self.incarnations)?;
                    fault.note = "the process restarted as the library runner; ".into();
                }
                std::fs::write(fleet::panic_file(&self.dir), b"panic")?;
                fault.target = self
                    .incarnations
                    .last()
                    .map_or(String::new(), |x| format!("{} (runner)", x.name));
                fault
                    .note
                    .push_str("its next partition's first chunk panics");
            }
            "panic" => {
                std::fs::write(fleet::panic_file(&self.dir), b"panic")?;
                fault.target = "the first runner to take it".into();
            }
            "corrupt-state" => {
                // Stopped first, so that no save lands between the flip and the kill:
                // the next start must read the damaged file.
                let slot = &mut self.slots[0];
                let pid = slot.pid().filter(|_| !slot.stopped);
                if let Some(pid) = pid {
                    fleet::signal(pid, "STOP");
                }
                let path = &self.setup.state;
                let mut bytes = std::fs::read(path)
                    .with_context(|| format!("could not read {}", path.display()))?;
                // Any byte but the format version's (8..12): a file of another version
                // is refused, never fallen back from (it may be a newer tranche's).
                let mut at = rng.below(bytes.len().saturating_sub(4).max(1));
                if at >= 8 {
                    at += 4.min(bytes.len() - at - 1);
                }
                bytes[at] ^= 0x5a;
                // The next start is `tranche run`, whose log says what it found.
                slot.next_kind = Some(Kind::Exec);
                std::fs::write(path, &bytes)
                    .with_context(|| format!("could not write {}", path.display()))?;
                fault.target = path
                    .file_name()
                    .map_or(String::new(), |n| n.to_string_lossy().into_owned());
                fault.note = format!("byte {at} of {} flipped", bytes.len());
                if pid.is_some() {
                    let name = self.incarnations.last().map(|x| x.name.clone());
                    slot.kill(&mut self.incarnations);
                    slot.restart_at = Some(Instant::now() + Duration::from_secs(1));
                    fault.note.push_str(&format!(
                        ", {} SIGKILLed before its next save",
                        name.unwrap_or_default()
                    ));
                }
            }
            "throttle" => {
                let (ok, out) =
                    self.tranche(&["throttle", "on", "--reason", "soak: an operator's throttle"])?;
                if !ok {
                    bail!("tranche throttle on: {out}");
                }
                // In force from when the command returned at the latest: the oracle's
                // window starts there.
                fault.at = self.secs();
                fault.target = "the namespace".into();
                fault.note = "tranche throttle on, then off".into();
                undo = Undo::Throttle;
            }
            "redis-kill" => {
                let ports = self.redis_ports();
                let n = if self.opts.cluster {
                    // A master: its replica takes over; the node comes back as a replica.
                    let masters: Vec<usize> = (0..self.nodes.len())
                        .filter(|&i| server::role(self.nodes[i].port).as_deref() == Some("master"))
                        .collect();
                    if masters.is_empty() {
                        fault.missed = Some("no master to kill".into());
                        self.faults.push(fault);
                        return Ok(None);
                    }
                    masters[rng.below(masters.len())]
                } else {
                    0
                };
                fault.target = format!("redis :{}", self.nodes[n].port);
                let _ = ports;
                self.nodes[n].kill();
                if self.opts.cluster {
                    thread::sleep(Duration::from_secs(5));
                }
                self.nodes[n].restart()?;
                fault.healed = Some(self.secs());
                fault.note = "SIGKILL, restarted from its AOF".into();
            }
            "redis-pause" => {
                self.proxy.as_ref().context("no proxy")?.set(Mode::Refuse);
                fault.note = "proxy refuses every connection".into();
                undo = Undo::Proxy;
            }
            "proxy" | "proxy-latency" | "proxy-blackhole" | "proxy-reset" => {
                let proxy = self.proxy.as_ref().context("no proxy")?;
                let pick = match kind.as_str() {
                    "proxy-latency" => 0,
                    "proxy-blackhole" => 1,
                    "proxy-reset" => 2,
                    _ => rng.below(3),
                };
                match pick {
                    0 => {
                        fault.kind = "proxy-latency".into();
                        proxy.set(Mode::Latency(Duration::from_millis(100)));
                        fault.note = "100 ms each way (200 ms round trip)".into();
                        undo = Undo::Proxy;
                    }
                    1 => {
                        fault.kind = "proxy-blackhole".into();
                        proxy.set(Mode::Blackhole);
                        undo = Undo::Proxy;
                    }
                    _ => {
                        fault.kind = "proxy-reset".into();
                        proxy.reset();
                        fault.healed = Some(self.secs());
                    }
                }
            }
            "failover" => {
                let replicas: Vec<u16> = self
                    .redis_ports()
                    .into_iter()
                    .filter(|&p| server::role(p).as_deref() == Some("slave"))
                    .collect();
                if replicas.is_empty() {
                    fault.missed = Some("no replica to fail over to".into());
                    self.faults.push(fault);
                    return Ok(None);
                }
                let port = replicas[rng.below(replicas.len())];
                resp::cmd(port, &["CLUSTER", "FAILOVER"])?;
                fault.target = format!("replica :{port}");
                fault.healed = Some(self.secs());
            }
            "corrupt-stats" | "corrupt-batch" | "corrupt-active" => {
                match self.corrupt(&kind, rng) {
                    Ok((port, key, field, value, note)) => {
                        fault.target = String::from_utf8_lossy(&key).into_owned();
                        fault.note = note;
                        undo = Undo::Check {
                            port,
                            key,
                            field,
                            value,
                        };
                    }
                    Err(err) => {
                        // Nothing corrupt was left behind, so there is nothing for
                        // `health` to find: the damage oracle leaves this one out.
                        fault.note = format!("not injected: {err:#}");
                        fault.missed = Some(format!("{err:#}"));
                        fault.persisted = Some(false);
                        self.faults.push(fault);
                        return Ok(None);
                    }
                }
            }
            other => bail!("fault `{other}` is not on this topology's menu"),
        }
        eprintln!(
            "xtask: soak: {at:6.1} s  {} {} {}",
            fault.kind, fault.target, fault.note
        );
        let heal_at = Instant::now()
            + match taken_over {
                Some(_) => self.opts.lease * options::AIMED_STOP_LEASES,
                None => faults::length(&fault.kind, self.opts.lease),
            };
        self.faults.push(fault);
        Ok(Some(Active {
            index: self.faults.len() - 1,
            heal_at,
            undo,
            taken_over,
        }))
    }

    /// One corrupt byte in a key the kind names: the key, the hash field, the new value.
    #[allow(clippy::type_complexity)]
    pub(super) fn corrupt(
        &self,
        kind: &str,
        rng: &mut Rng,
    ) -> Result<(u16, Vec<u8>, Option<Vec<u8>>, Vec<u8>, String)> {
        let pattern = match kind {
            "corrupt-stats" => "*:stats:ranges",
            "corrupt-batch" => "*:completed:batch:*",
            _ => "*:active",
        };
        let mut keys = self.scan_masters(pattern)?;
        let mut note = String::new();
        if keys.is_empty() && kind == "corrupt-batch" {
            // The simple tier: no batch string yet, so an archived record instead.
            keys = self.scan_masters("*:completed")?;
            note = "no batch string yet: an archived record of the simple tier; ".into();
        }
        if keys.is_empty() {
            bail!("no key matches {pattern}");
        }
        // A random key that holds something: at the fast profile's pace most shards'
        // `active` hashes are empty at any instant, and an empty one has nothing to
        // corrupt (the fault would not take effect).
        let start = rng.below(keys.len());
        let mut chosen = None;
        for i in 0..keys.len() {
            let (port, key) = &keys[(start + i) % keys.len()];
            let key_type = resp::call(*port, &[b"TYPE", key])?.text();
            let len: &[u8] = if key_type == "string" {
                b"STRLEN"
            } else {
                b"HLEN"
            };
            if matches!(resp::call(*port, &[len, key])?, resp::Reply::Int(n) if n > 0) {
                chosen = Some((*port, key.clone(), key_type));
                break;
            }
        }
        let Some((port, key, key_type)) = chosen else {
            bail!("every key matching {pattern} is empty");
        };
        if key_type == "string" {
            let resp::Reply::Bytes(value) = resp::call(port, &[b"GET", &key])? else {
                bail!("GET of a string key returned no bytes");
            };
            if value.is_empty() {
                bail!("an empty batch string");
            }
            let at = rng.below(value.len());
            let byte = [value[at] ^ 0x5a];
            resp::call(port, &[b"SETRANGE", &key, at.to_string().as_bytes(), &byte])?;
            let mut new = value;
            new[at] = byte[0];
            note.push_str(&format!("byte {at} flipped"));
            return Ok((port, key, None, new, note));
        }
        let resp::Reply::Array(fields) = resp::call(port, &[b"HKEYS", &key])? else {
            bail!("HKEYS failed");
        };
        let fields: Vec<Vec<u8>> = fields
            .into_iter()
            .filter_map(|f| match f {
                resp::Reply::Bytes(b) => Some(b),
                _ => None,
            })
            .collect();
        if fields.is_empty() {
            bail!("an empty hash");
        }
        if kind == "corrupt-stats" {
            let field = fields[rng.below(fields.len())].clone();
            note.push_str("value set to the one byte \\x80");
            let value = vec![0x80];
            resp::call(port, &[b"HSET", &key, &field, &value])?;
            return Ok((port, key, Some(field), value, note));
        }
        // Live records come and go: flip the byte in one script, so a field that went
        // away between HKEYS and now is not written back as a record of its own.
        for _ in 0..5 {
            let field = fields[rng.below(fields.len())].clone();
            let at = rng.next().to_string();
            let reply = resp::call(
                port,
                &[
                    b"EVAL",
                    FLIP_ONE_BYTE.as_bytes(),
                    b"1",
                    &key,
                    &field,
                    at.as_bytes(),
                ],
            )?;
            if let resp::Reply::Array(r) = reply
                && let [resp::Reply::Int(at), resp::Reply::Bytes(value)] = &r[..]
            {
                note.push_str(&format!(
                    "byte {at} of field {} flipped",
                    String::from_utf8_lossy(&field)
                ));
                return Ok((port, key, Some(field), value.clone(), note));
            }
        }
        bail!("the fields went away")
    }

    /// The keys matching `pattern` on every master, with the master's port.
    pub(super) fn scan_masters(&self, pattern: &str) -> Result<Vec<(u16, Vec<u8>)>> {
        let mut found = Vec::new();
        for port in self.redis_ports() {
            if self.opts.cluster && server::role(port).as_deref() != Some("master") {
                continue;
            }
            found.extend(resp::scan(port, pattern)?.into_iter().map(|k| (port, k)));
        }
        Ok(found)
    }

    /// Freezes slot `i` (incarnation `name`) at a moment its ledger shows a chunk of it
    /// open, trying for [`AIM_FOR`]: the open chunks' ranges, the process left frozen,
    /// or none, the process running; and how many freezes were thawed mid-line. A
    /// runner's lines are its own process's writes, so they hold still while it is
    /// frozen; an exec worker's chunks run on in their groups, which only a kill must
    /// find open. Nor is a runner left frozen in the middle of a line (its line lock
    /// held): a line stamped before the freeze and written after the thaw would date
    /// an END before the take-over the stop waits for, and a chunk the ledger showed
    /// open would read as ended before it.
    fn freeze_mid_chunk(&mut self, i: usize, name: &str) -> (Vec<(u64, u64)>, u32) {
        let Some(pid) = self.slots[i].pid() else {
            return (Vec::new(), 0);
        };
        let ledger = self.slots[i].ledger(&self.setup);
        let line_lock = self.slots[i].line_lock(&self.setup);
        let until = Instant::now() + AIM_FOR;
        let mut mid_lines = 0;
        while Instant::now() < until {
            fleet::signal(pid, "STOP");
            let open = open_chunks(&ledger, name);
            if !open.is_empty() {
                if !mid_line(&line_lock) {
                    return (open, mid_lines);
                }
                mid_lines += 1;
            }
            fleet::signal(pid, "CONT");
            thread::sleep(Duration::from_millis(20));
        }
        (Vec::new(), mid_lines)
    }

    /// Whether an aimed stop's wait is over: another worker started a chunk over one
    /// the frozen worker holds open.
    pub(super) fn taken_over(&self, a: &Active) -> bool {
        let Some(t) = &a.taken_over else {
            return false;
        };
        self.slots
            .iter()
            .filter(|s| s.index != t.slot)
            .any(|s| started_over(&s.ledger(&self.setup), &t.ranges, t.after_us))
    }

    pub(super) fn heal(&mut self, a: &mut Active) {
        match &a.undo {
            Undo::Nothing => {}
            Undo::Cont(i) => {
                if let Some(pid) = self.slots[*i].pid() {
                    fleet::signal(pid, "CONT");
                }
                self.slots[*i].stopped = false;
            }
            Undo::Proxy => {
                if let Some(p) = &self.proxy {
                    p.set(Mode::Pass);
                }
            }
            Undo::Throttle => {
                // Lifted from here on: the oracle's window ends here.
                self.faults[a.index].healed = Some(self.secs());
                let lifted =
                    (0..3).any(|_| matches!(self.tranche(&["throttle", "off"]), Ok((true, _))));
                if !lifted {
                    eprintln!("xtask: soak: tranche throttle off failed three times");
                    self.faults[a.index]
                        .note
                        .push_str("; NOT LIFTED: tranche throttle off failed");
                }
            }
            Undo::Check {
                port,
                key,
                field,
                value,
            } => {
                let now = match field {
                    Some(f) => resp::call(*port, &[b"HGET", key, f]),
                    None => resp::call(*port, &[b"GET", key]),
                };
                self.faults[a.index].persisted =
                    Some(matches!(now, Ok(resp::Reply::Bytes(b)) if &b == value));
            }
        }
        if self.faults[a.index].healed.is_none() {
            self.faults[a.index].healed = Some(self.secs());
        }
    }
}

/// How long an aimed kill or stop waits for its target to have a chunk open.
const AIM_FOR: Duration = Duration::from_secs(5);

/// An aimed stop's end: when another worker starts a chunk over one the frozen one
/// holds.
pub(super) struct TakeOver {
    /// The frozen slot.
    slot: usize,
    /// Its open chunks' ranges.
    ranges: Vec<(u64, u64)>,
    /// When it was frozen (µs since the epoch, the ledgers' clock).
    after_us: u64,
}

/// The ranges of `name`'s chunks open in `ledger`: a START and no line after it.
fn open_chunks(ledger: &Path, name: &str) -> Vec<(u64, u64)> {
    let mut open: Vec<(u64, u64, u32)> = Vec::new();
    for l in std::fs::read_to_string(ledger).unwrap_or_default().lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() != 7 || f[4] != name {
            continue;
        }
        let (Ok(from), Ok(to), Ok(chunk)) = (f[2].parse(), f[3].parse(), f[5].parse()) else {
            continue;
        };
        open.retain(|&o| o != (from, to, chunk));
        if f[0] == "START" {
            open.push((from, to, chunk));
        }
    }
    open.into_iter().map(|(from, to, _)| (from, to)).collect()
}

/// Whether the process of `lock` (a runner's `SOAK_LINE_LOCK`) holds it: it was frozen
/// between a line's timestamp and its write. No such file (an exec worker's slot, a
/// runner that has not written yet), no line in the middle.
fn mid_line(lock: &Path) -> bool {
    let Ok(file) = std::fs::File::open(lock) else {
        return false;
    };
    // Unlocked when `file` is closed, before the thaw.
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// Whether `ledger` has a START after `after_us` over any of `ranges`.
fn started_over(ledger: &Path, ranges: &[(u64, u64)], after_us: u64) -> bool {
    std::fs::read_to_string(ledger)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 7 && f[0] == "START").then_some(())?;
            Some((
                f[2].parse::<u64>().ok()?,
                f[3].parse::<u64>().ok()?,
                f[6].parse::<u64>().ok()?,
            ))
        })
        .any(|(from, to, at)| at > after_us && ranges.iter().any(|&(a, b)| from <= b && to >= a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(lines: &[&str]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("soak-aim-{}-{}.log", std::process::id(), now_us()));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        path
    }

    /// A chunk is open from its START until any line of the same chunk after it;
    /// another incarnation's lines and torn lines are not its.
    #[test]
    fn open_chunks_are_starts_with_no_line_after_them() {
        let path = ledger(&[
            "START 1 1 50 w2.0 77 100",
            "START 1 51 100 w2.0 77 110",
            "END 1 1 50 w2.0 77 150",
            "START 2 1001 1250 w0.0 88 120",
            "START 3 2001 20",
            "START 4 3001 3050 w2.0 77 160",
            "KILL 4 3001 3050 w2.0 77 170",
        ]);
        assert_eq!(open_chunks(&path, "w2.0"), vec![(51, 100)]);
        assert_eq!(open_chunks(&path, "w0.0"), vec![(1001, 1250)]);
        assert!(open_chunks(&path, "w1.0").is_empty());
        let _ = std::fs::remove_file(path);
    }

    /// A line lock held by another open file description is a line in the middle;
    /// a free one, or none, is not.
    #[test]
    fn a_held_line_lock_is_a_line_in_the_middle() {
        let path =
            std::env::temp_dir().join(format!("soak-lock-{}-{}", std::process::id(), now_us()));
        assert!(!mid_line(&path));
        let writer = std::fs::File::create(&path).unwrap();
        assert!(!mid_line(&path));
        writer.lock().unwrap();
        assert!(mid_line(&path));
        writer.unlock().unwrap();
        assert!(!mid_line(&path));
        let _ = std::fs::remove_file(path);
    }

    /// A take-over is a START after the freeze over a range that meets a frozen one.
    #[test]
    fn a_take_over_is_a_later_start_over_a_frozen_range() {
        let path = ledger(&["START 1 1 250 w0.0 9 100", "START 1 251 500 w0.0 9 300"]);
        assert!(started_over(&path, &[(201, 250)], 50));
        assert!(!started_over(&path, &[(201, 250)], 150));
        assert!(started_over(&path, &[(500, 600)], 150));
        assert!(!started_over(&path, &[(501, 600)], 0));
        let _ = std::fs::remove_file(path);
    }
}

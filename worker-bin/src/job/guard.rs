//! The guard: the shell every `--exec` chunk starts in ([`GUARD`]) or every warm
//! process's group is led by ([`WARM_GUARD`]), and the [`Fence`] that tells it of the
//! lease's renewals.
//!
//! A chunk must not outlive its worker, however the worker dies (SIGKILL, the OOM
//! killer): the chunk's stdin is a pipe whose write end only the worker holds, and the
//! guard watches it from inside the chunk's group. The kernel closes that end when the
//! worker dies, the watcher reads end-of-file and kills the whole group. No `pre_exec`
//! (the crate forbids unsafe code), and grandchildren are covered, which
//! `PR_SET_PDEATHSIG` would not do.
//!
//! Nor does it outlive its lease when the worker is alive but frozen (SIGSTOP, a
//! machine suspended under it): a frozen worker closes no pipe and sends no signal, and
//! its chunks run on in their own group while the lease expires. So the guard also
//! fences the chunk on the lease: it starts with how long the lease certainly holds,
//! the worker writes one line on the same pipe per accepted renewal (at most one per
//! sixth of a lease), and when none came in time the guard stops the group itself,
//! SIGTERM, then SIGKILL, on the instants `held` would use, before the store's deadline
//! could pass. Its timer is a background `sleep`: two forks per line, nothing in
//! between, so lines are few. An `--exec` chunk's guard gets one when it starts and one
//! per renewal told; a warm process's guard stays armed between chunks and is told
//! again only when a chunk's fence does not [`keep`](Fence::keeps) the instant it has.
//! It needs a `sleep` that takes fractions of a second (GNU, BusyBox and the BSDs' do;
//! POSIX asks only for whole seconds); where the worker finds none, it says so once
//! and its chunks are guarded against its death only. An in-process handler needs no
//! such guard, being frozen with its worker; it is not polled again once its lease went
//! unrenewed too long, so it does not finish its work after a thaw either.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, Command};
use tokio::sync::watch;
use tokio::time::Instant;

use super::ChunkError;

/// The part of the guards that starts the watcher (see [`GUARD`]); `$2` and `$3` are
/// `STOP` and `GRACE`, empty without a fence.
macro_rules! watcher {
    () => {
        r#"exec 3<&0 </dev/null
{
  trap '' TERM
  t=
  disarm() {
    [ -z "$t" ] || kill -USR1 "$t"
    t=
  }
  arm() {
    disarm
    ( trap '[ -z "$p" ] || kill -KILL "$p"; exit' USR1
      sleep "$1" & p=$!
      wait "$p" && p= && kill -TERM 0 && sleep "$2" && kill -KILL 0 ) 3<&- &
    t=$!
  }
  [ -z "$2" ] || arm "$2" "$3"
  while read -r s <&3; do
    if [ "$s" = - ]; then disarm; else arm "$s" "$3"; fi
  done
  kill -KILL 0
} >/dev/null 2>&1 &
"#
    };
}

/// The shell every chunk starts in (`sh -c GUARD tranche-chunk CMD [STOP GRACE]`), its
/// stdin the worker's lifeline pipe. It moves the pipe to fd 3 (stdin becomes
/// /dev/null), starts the watcher, a background subshell of the same process group, then
/// `exec`s `sh -c CMD`, so the chunk's pid, group, exit status and terminating signal are
/// its shell's, which ends as the command does (126 and 127 included). The watcher starts
/// before the command: a worker that dies at any moment after the spawn leaves a pipe at
/// end-of-file, which the watcher finds whenever it reads.
///
/// The watcher blocks reading fd 3 and, at end-of-file, kills the group (`kill -KILL
/// 0`). When the chunk ends, the worker closes its end too, and the watcher takes what
/// the command left running in its group along: the chunk is over, so is everything it
/// started. With `STOP` (seconds, fractions allowed) it also arms a timer, and re-arms
/// it with each line it reads (the seconds from then): a subshell that sleeps that long,
/// then sends SIGTERM to the group, sleeps `GRACE` and sends SIGKILL. Re-arming cancels
/// the timer before (SIGUSR1: it kills its `sleep`, unless that one is over and reaped,
/// its pid free for another process, and exits). The watcher and its
/// timers ignore SIGTERM, so that a SIGTERM to the group (a drain's, a fence's, the
/// timer's own) stops the command but leaves the group's guards to finish the job.
pub(super) const GUARD: &str = concat!(watcher!(), r#"exec sh -c "$1" sh 3<&-"#);

/// The guard of a plain command ([`plain_words`]): `sh -c GUARD_DIRECT tranche-chunk CMD
/// STOP GRACE WORD...` (`STOP` and `GRACE` empty without a fence). The same watcher,
/// then the command's words `exec`ed as they are, with no `sh -c` in between: the shell
/// would only have split them and forked the command, one process more a chunk. The
/// chunk's pid is the command's own, and `exec` ends in 127 or 126 where `sh -c` would.
pub(super) const GUARD_DIRECT: &str = concat!(watcher!(), "shift 3\nexec \"$@\" 3<&-");

/// The guard of a warm process (`persistent.rs`): `sh -c WARM_GUARD tranche-warm "" ""
/// GRACE`, the lifeline its stdin, leading the process group the warm command then
/// joins. The same watcher, unarmed at first, then `wait`. A number of seconds arms its
/// timer for a chunk, as it re-arms it on a renewal; a line `-` disarms it (a chunk
/// with no fence). The worker leaves it armed between chunks: the next chunk's fence
/// mostly [keeps](Fence::keeps) the instant it has, and costs no line. An idle process
/// whose timer fires is stopped, and the next chunk starts another.
pub(super) const WARM_GUARD: &str = concat!(watcher!(), "wait\n");

/// Names a shell may take as its own rather than as a program on `PATH`: the reserved
/// words and the builtins of dash, bash, ksh and BusyBox's ash. A command starting with
/// one keeps its `sh -c` (`exit 3` exits the shell, `echo` is the shell's echo).
#[rustfmt::skip]
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "[[", "alias", "autoload", "bg", "bind", "break", "builtin", "caller",
    "case", "cd", "chdir", "command", "compgen", "complete", "compopt", "continue",
    "coproc", "declare", "dirs", "disown", "do", "done", "echo", "elif", "else", "enable",
    "esac", "eval", "exec", "exit", "export", "false", "fc", "fg", "fi", "for", "function",
    "functions", "getopts", "hash", "help", "history", "if", "in", "integer", "jobs",
    "kill", "let", "local", "logout", "mapfile", "nameref", "popd", "print", "printf",
    "pushd", "pwd", "read", "readarray", "readonly", "return", "select", "set", "shift",
    "shopt", "source", "suspend", "test", "then", "time", "times", "trap", "true", "type",
    "typeset", "ulimit", "umask", "unalias", "unset", "until", "wait", "whence", "while",
];

/// The words of `cmd` when the shell would do nothing with it but split it on blanks
/// and run the program its first word names: only letters, digits, blanks and
/// `_@%+=:,./-` (no quote, escape, expansion, redirection, glob, separator or comment),
/// and a first word that is neither an assignment, an option-like word nor one of
/// [`SHELL_WORDS`]. Such a command (`./reindex.sh`, `bash backfill.sh --fast`) runs
/// under [`GUARD_DIRECT`]; anything else under [`GUARD`].
pub(super) fn plain_words(cmd: &str) -> Option<Vec<&str>> {
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || c == ' ' || c == '\t' || "_@%+=:,./-".contains(c);
    if !cmd.chars().all(allowed) {
        return None;
    }
    let words: Vec<&str> = cmd.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    let starts_well = first
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || "_./".contains(c));
    (starts_well && !first.contains('=') && first != ".." && !SHELL_WORDS.contains(&first))
        .then_some(words)
}

/// Where a chunk's lease stands, for its guard: until when the store certainly holds
/// it (`held`'s instant, moved by every accepted renewal) and, before that, when the
/// chunk is stopped and when it is killed if no renewal moved them on.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    /// The lease's last certain instant, updated by each accepted renewal.
    valid_until: watch::Receiver<Instant>,
    /// How long before `valid_until` the chunk is stopped: a command's group gets
    /// SIGTERM, a handler is no longer polled.
    stop_before: Duration,
    /// How long before `valid_until` a command's group gets SIGKILL.
    kill_before: Duration,
    /// A renewal that moves the stop instant by less than this since the last one told
    /// is not told: stragglers renew every 250 ms, and each line costs the guard two
    /// forks. The guard's instant lags by less than this, earlier, never later.
    step: Duration,
}

impl Fence {
    /// A fence on `valid_until`: stop `stop_before` it, kill `kill_before` it (less
    /// than `stop_before`), telling the guard of renewals at least `step` apart.
    pub(crate) fn new(
        valid_until: watch::Receiver<Instant>,
        stop_before: Duration,
        kill_before: Duration,
        step: Duration,
    ) -> Self {
        debug_assert!(kill_before <= stop_before);
        Self {
            valid_until,
            stop_before,
            kill_before,
            step,
        }
    }

    /// When the chunk is stopped unless a renewal comes first.
    pub(crate) fn stop_at(&self) -> Instant {
        *self.valid_until.borrow() - self.stop_before
    }

    /// Whether a guard armed for `armed` may guard a chunk under this fence as it is, with
    /// no line (two forks) to re-arm it: it stops the chunk no later than the fence would
    /// ([`stop_at`](Self::stop_at)) and less than a step earlier, the lag [`tell`] allows
    /// too, and it is not within a step of firing (a renewal then might not be told in
    /// time). A warm process's next chunk mostly finds it so: one heartbeat renews every
    /// lease of a worker, which then share their stop instant, and moves it by more than a
    /// step, which re-arms each guard once per beat.
    pub(super) fn keeps(&self, armed: Instant, now: Instant) -> bool {
        let stop_at = self.stop_at();
        armed <= stop_at && stop_at < armed + self.step && armed >= now + self.step
    }

    /// Whether the chunk must be stopped now.
    pub(super) fn is_due(&self) -> bool {
        Instant::now() >= self.stop_at()
    }

    /// Between SIGTERM and SIGKILL.
    pub(super) fn grace(&self) -> Duration {
        self.stop_before - self.kill_before
    }
}

/// A duration as `sleep` takes it: seconds with three decimals, rounded down (the guard
/// fires early rather than late).
pub(super) fn secs(d: Duration) -> String {
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// Whether this system's `sleep` takes fractions of a second, which the guard's timer
/// needs. Asked once per process; when it does not, chunks are guarded against their
/// worker's death only, and the worker says so once.
pub(super) async fn guard_can_time() -> bool {
    static CAN: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    *CAN.get_or_init(|| async {
        let can = Command::new("sh")
            .args(["-c", "sleep 0.001"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        if !can {
            tracing::warn!(
                "`sleep 0.001` fails here: chunks are killed when this worker dies, but not \
                 when it is frozen past its lease (SIGSTOP); install a `sleep` that takes \
                 fractions of a second (coreutils, BusyBox)"
            );
        }
        can
    })
    .await
}

/// The fence a chunk's guard is to hold: none without one, or where [`guard_can_time`]
/// finds no `sleep` to time it; [`ChunkError::Interrupted`] when it is already due (a
/// worker that thawed past its lease: the guard would stop the chunk at once, but not
/// before it began).
pub(super) async fn usable_fence(fence: Option<Fence>) -> Result<Option<Fence>, ChunkError> {
    match fence {
        Some(fence) if fence.is_due() => Err(ChunkError::Interrupted),
        Some(fence) if guard_can_time().await => Ok(Some(fence)),
        _ => Ok(None),
    }
}

/// Tells the guard of each renewal that moves its stop instant on by a step: one line,
/// the seconds from now. `told` is the stop instant the guard has. Never returns: with
/// no fence, the fence's sender gone or the guard gone, nothing is told any more.
pub(super) async fn tell(
    lifeline: &mut ChildStdin,
    fence: Option<Fence>,
    told: &mut Option<Instant>,
) -> std::convert::Infallible {
    if let Some(mut fence) = fence {
        while fence.valid_until.changed().await.is_ok() {
            let stop_at = fence.stop_at();
            if told.is_some_and(|t| stop_at < t + fence.step) {
                continue;
            }
            let line = format!(
                "{}\n",
                secs(stop_at.saturating_duration_since(Instant::now()))
            );
            if lifeline.write_all(line.as_bytes()).await.is_err() {
                break;
            }
            *told = Some(stop_at);
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;
    use std::time::Duration;

    use tokio::process::Command;
    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::*;

    /// Renewals closer together than the step are not told: the guard re-arms (two
    /// forks) at most once per step, and is told the seconds from now.
    #[tokio::test]
    async fn renewals_are_told_once_per_step() {
        let mut cat = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut pipe = cat.stdin.take().unwrap();
        let start = Instant::now() + Duration::from_secs(10);
        let (renewals, rx) = watch::channel(start);
        let ms = Duration::from_millis;
        let fence = Fence::new(rx, ms(2000), ms(1000), ms(350));
        let mut told = Some(start - ms(2000));
        let renew = async {
            // Ten renewals 100 ms apart in lease time, 20 ms apart here.
            for k in 1..=10 {
                renewals.send_replace(start + ms(100 * k));
                tokio::time::sleep(ms(20)).await;
            }
        };
        tokio::select! {
            () = renew => {}
            never = tell(&mut pipe, Some(fence), &mut told) => match never {},
        }
        drop(pipe);
        let out = cat.wait_with_output().await.unwrap();
        let lines: Vec<f64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        // The 4th (400 ms past the start: a step) and the 8th (400 ms past the 4th).
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(told, Some(start + ms(800) - ms(2000)));
        // Seconds from when each was told: a little under 8.4 s, then 8.8 s.
        assert!(lines[0] > 8.0 && lines[0] <= 8.4, "{lines:?}");
        assert!(lines[1] > 8.4 && lines[1] <= 8.8, "{lines:?}");
    }

    /// A guard armed for an instant keeps guarding the next chunk when that instant is
    /// no later than the chunk's stop instant, less than a step earlier and not within a
    /// step of now; else it is re-armed.
    #[test]
    fn a_fence_keeps_an_instant_no_later_and_less_than_a_step_earlier() {
        let now = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        // The fence's stop instant and the guard's, in ms from now; the step is 1 s.
        let check = |stop_at: u64, armed: u64| {
            let (_tx, rx) = watch::channel(now + ms(stop_at) + ms(2000));
            Fence::new(rx, ms(2000), ms(1000), ms(1000)).keeps(now + ms(armed), now)
        };
        let keeps = [(5000, 5000), (5000, 4001), (1500, 1000), (1000, 1000)];
        let re_arms = [
            // Later than the chunk's stop instant: the guard would let it run past it.
            (5000, 5001),
            (1000, 60_000),
            // A step earlier or more: the chunk would be stopped that much early.
            (5000, 4000),
            (60_000, 1000),
            // Within a step of firing, a renewal might not be told in time.
            (1500, 999),
            (500, 500),
        ];
        for (stop_at, armed) in keeps {
            assert!(check(stop_at, armed), "keeps {armed} for {stop_at}");
        }
        for (stop_at, armed) in re_arms {
            assert!(!check(stop_at, armed), "re-arms {armed} for {stop_at}");
        }
    }

    /// A plain command's words; anything the shell would do more with is not plain.
    #[test]
    fn plain_words_are_a_program_and_its_arguments() {
        assert_eq!(plain_words("./reindex.sh"), Some(vec!["./reindex.sh"]));
        assert_eq!(
            plain_words("  bash  /opt/x/backfill.sh\t--rate=20 -v a,b:c@d%e+f "),
            Some(vec![
                "bash",
                "/opt/x/backfill.sh",
                "--rate=20",
                "-v",
                "a,b:c@d%e+f"
            ])
        );
        assert_eq!(
            plain_words("env FOO=1 psql"),
            Some(vec!["env", "FOO=1", "psql"])
        );
        for shell in [
            "",
            "   ",
            "echo $TRANCHE_FROM",
            "a; b",
            "a && b",
            "a | b",
            "a > out",
            "a\nb",
            "'quoted'",
            "\"quoted\"",
            "a\\ b",
            "ls *.sh",
            "ls ~",
            "a # comment",
            "(a)",
            "{ a; }",
            "a &",
            "FOO=1 cmd",
            "-x",
            "exit 3",
            "echo hi",
            "cd /tmp",
            "true",
            "time ./x",
            "while",
            ". ./lib.sh",
            "..",
        ] {
            assert_eq!(plain_words(shell), None, "{shell:?}");
        }
    }
}
